"""Worker settings, read from BENCHLAB_* environment variables (and an optional .env)."""
from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def artifact_dir(root: Path, job_id: int, attempt: int = 1) -> Path:
    """Where one attempt of a job keeps its artifacts under `root`: `job_<id>/` for the first, and
    `job_<id>/attempt_<n>/` for a retry, so a retried job's files never meet the earlier ones'."""
    folder = root / f"job_{job_id}"
    return folder if attempt <= 1 else folder / f"attempt_{attempt}"


class SharedSettings(BaseSettings):
    """What every process of one deployment agrees on: where its data lives and its API token."""

    model_config = SettingsConfigDict(env_prefix="BENCHLAB_", env_file=".env", extra="ignore", allow_inf_nan=False)

    data_dir: Path = Field(Path("./benchlab-data"),
                           description="the SQLite file, artifacts, the embedded broker's folders")
    api_token: str | None = Field(None, description="the API's bearer token: the API checks it (every write; "
                                                    "every read too with protect_reads), workers send it")

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def artifact_root(self) -> Path:
        return self.resolved_data_dir / "artifacts"

    def artifact_dir(self, job_id: int, attempt: int = 1) -> Path:
        """Where one attempt of a job keeps its artifacts (artifact_dir under artifact_root)."""
        return artifact_dir(self.artifact_root, job_id, attempt)


class WorkerSettings(SharedSettings):
    """The worker's own settings (and the job limits the API enforces with them)."""

    broker_url: str | None = Field(None, description="redis://host:6379/0 for real deployments; "
                                                     "default: filesystem broker under data_dir")
    broker_poll_interval_s: float = Field(0.02, gt=0, description="filesystem broker polling interval")
    job_timeout_s: float = Field(1800.0, gt=0, description="a job running longer is killed and recorded as `timeout`")
    max_job_timeout_s: float = Field(24 * 3600.0, gt=0, description="the largest timeout_s a sweep may ask; "
                                     "the Redis visibility timeout is derived from it")
    timeout_grace_s: float = Field(120.0, ge=0, description="a running job past its timeout plus this is lost")
    heartbeat_file: Path | None = Field(None, description="touched at each heartbeat (a container healthcheck "
                                                          "reads its age)")
    heartbeat_s: float = Field(5.0, gt=0, description="how often a worker says it is alive")
    gpus: str | None = Field(None, description="the GPUs this worker advertises and leases, as comma-separated "
                                               "names (default: what nvidia-smi lists, narrowed by "
                                               "CUDA_VISIBLE_DEVICES); e.g. to try placement on a host with none")
    gpu_lock_dir: Path = Field(Path(tempfile.gettempdir()) / "benchlab-gpus",
                               description="one lock file per GPU, shared by every worker of the host: no two "
                                           "jobs run on one GPU at once")
    runner_max_jobs: int = Field(100, gt=0, description="replace the warm runner process after this many jobs")
    runner_startup_timeout_s: float = Field(300.0, gt=0, description="a runner process not ready (imports done) by "
                                            "then fails the job it was started for; not counted in the job's timeout")
    runner_memory_gb: float | None = Field(None, gt=0, description="host memory (GB, resident, the runner and "
                                           "its ranks) a job may hold: past it the job is killed and recorded "
                                           "`oom`; default: no limit, and the kernel's OOM killer gives `failed`")
    api_url: str | None = Field(None, description="where to upload artifacts when the worker shares no disk with "
                                                  "the API")
    commit: str | None = Field(None, description="git commit to record; wins over git (a copied tree may carry a "
                                                 "stale .git)")

    @property
    def visibility_timeout_s(self) -> int:
        """Redis hands an unacknowledged job out again after this: longer than any job may run."""
        return int(self.max_job_timeout_s + self.runner_startup_timeout_s + self.timeout_grace_s + 600)

    @property
    def broker_dir(self) -> Path:
        return self.resolved_data_dir / "broker"

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def is_embedded_broker(self) -> bool:
        return self.effective_broker_url.startswith("filesystem://")


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
