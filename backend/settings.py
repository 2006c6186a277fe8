"""Backend settings, read from BENCHLAB_* environment variables (and an optional .env)."""
from __future__ import annotations

from functools import lru_cache

from pydantic import Field

from worker.settings import SharedSettings


class BackendSettings(SharedSettings):
    """The API's own settings; data_dir and api_token come from SharedSettings."""

    database_url: str | None = Field(None, description="default: sqlite:///<data_dir>/benchlab.db")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    protect_reads: bool = Field(False, description="with api_token (or require_token): reads need a token too")
    require_token: bool = Field(False, description="writes need a token even without api_token: named tokens "
                                                   "(`benchlab token create`) only")
    max_grid_cells: int = Field(10_000, gt=0, description="largest grid one sweep may expand to")
    default_queue: str = "default"
    auto_migrate: bool = Field(True, description="the API upgrades the schema at start; false: it refuses and "
                                                 "says to run `benchlab db upgrade`")
    db_pool_size: int = Field(10, ge=1, description="PostgreSQL connections per process (plus 4 overflow)")
    max_body_kb: int = Field(1024, ge=1, description="requests with a larger body are refused (413)")
    max_artifact_mb: float = Field(512.0, gt=0, description="artifact uploads larger than this are refused (413)")
    max_waiters: int = Field(64, ge=1, description="held GET ?wait_s requests at once; more answer 429")
    allowed_hosts: str = Field("*", description="comma-separated Host header values the API answers "
                                                "(against DNS rebinding), e.g. bench.example.com,127.0.0.1")
    worker_lost_after_s: float = Field(30.0, gt=0, description="a worker silent this long is gone: its job "
                                                              "is recorded `failed: worker lost`")
    artifact_max_age_days: float | None = Field(None, gt=0, description="artifacts older than this are removed")
    artifact_max_total_mb: float | None = Field(None, gt=0, description="the oldest artifacts are removed while "
                                                                        "all of them take more than this")
    reap_interval_s: float = Field(5.0, gt=0, description="how often the recorder looks for lost jobs")

    @property
    def auth_required(self) -> bool:
        """Whether writes (and with protect_reads, reads) need a token."""
        return bool(self.api_token) or self.require_token

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'benchlab.db'}"


@lru_cache(maxsize=1)
def get_settings() -> BackendSettings:
    return BackendSettings()
