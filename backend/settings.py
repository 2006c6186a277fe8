"""Backend settings, read from BENCHLAB_* environment variables (and an optional .env)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BackendSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BENCHLAB_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("./benchlab-data"), description="SQLite file, artifacts, embedded broker")
    database_url: str | None = Field(None, description="default: sqlite:///<data_dir>/benchlab.db")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_token: str | None = Field(None, description="when set, every write needs Authorization: Bearer <token>")
    protect_reads: bool = Field(False, description="with api_token: reads need the token too")
    max_grid_cells: int = Field(10_000, gt=0, description="largest grid one sweep may expand to")
    default_queue: str = "default"

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'benchlab.db'}"

    @property
    def artifact_root(self) -> Path:
        return self.resolved_data_dir / "artifacts"


@lru_cache(maxsize=1)
def get_settings() -> BackendSettings:
    return BackendSettings()
