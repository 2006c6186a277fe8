"""/api/plan and the planner page's numbers: backend/planner.py fed by benchlab's own measurements."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator
from sqlmodel import SQLModel, select

from backend import commfit, service
from backend.deps import ReadAuth, SessionDep
from backend.errors import invalid_query
from backend.models import Sweep
from backend.planner import Cluster, Model, plan, predict_measured
from worker.stats import positive
from worker.suites.leaderboard import REFERENCE_PEAK_TFLOPS

router = APIRouter(prefix="/api", tags=["planner"], dependencies=[ReadAuth])

# used when neither the caller nor a measurement gives them: the H200's datasheet (dense bf16 matmul, as
# the leaderboard suite's table has it; NVLink, per direction)
REFERENCE_TFLOPS, REFERENCE_GBPS, REFERENCE_MEMORY_GB = REFERENCE_PEAK_TFLOPS["H200"], 450.0, 141.0


def measured_inputs(db) -> dict[str, Any]:
    """C and W from benchlab's own results: the newest model or leaderboard sweep with a measured
    matmul peak (both suites measure it the same way: worker.harness.measured_peak_tflops), and the
    all-reduce fit of the newest multi-GPU allreduce sweep (bus bandwidth)."""
    found: dict[str, Any] = {}
    for sweep in db.exec(select(Sweep).where(Sweep.suite.in_(("model", "leaderboard", "allreduce")))
                         .order_by(Sweep.id.desc()).limit(100)).all():
        rows = service.result_rows(db, sweep.id)
        if sweep.suite in ("model", "leaderboard") and "flops" not in found:
            peaks = [peak for r in rows if r["state"] == "done"
                     and (peak := positive((r["metrics"] or {}).get("peak_tflops_measured"))) is not None]
            if peaks:
                found["flops"] = {"tflops": max(peaks),
                                  "source": f"{sweep.suite} sweep #{sweep.id} (measured matmul peak)"}
        if sweep.suite == "allreduce" and "bandwidth" not in found:
            worlds = sorted({r["params"].get("world_size") for r in rows
                             if r["state"] == "done" and (r["metrics"] or {}).get("backend") == "nccl"
                             and r["params"].get("world_size", 1) > 1})
            for n in worlds:
                try:
                    fit = commfit.fit_latency_bandwidth(commfit.allreduce_points(rows, n))
                except ValueError:
                    continue
                bus = fit["w_gbps"] * 2 * (n - 1) / n
                found["bandwidth"] = {"gbps": bus, "latency_us": fit["o_ms"] * 1e3,
                                      "source": f"allreduce sweep #{sweep.id} ({n} GPUs, fitted bus bandwidth)"}
                break
        if len(found) == 2:
            break
    return found


class PlanQuery(BaseModel):
    """The planner's inputs, one definition for /api/plan, the planner page and `benchlab plan`: every
    number positive and finite. A dim left out is the named size's; C, W and memory left out are
    measured or the H200's datasheet (make_plan)."""

    size: str = Field("xl", max_length=20, description="a named size (small .. 10B) or custom, with the dims")
    d_model: int | None = Field(None, gt=0, le=1 << 20)
    d_ff: int | None = Field(None, gt=0, le=1 << 22)
    num_layers: int | None = Field(None, gt=0, le=1 << 16)
    num_heads: int | None = Field(None, gt=0, le=1 << 16)
    vocab_size: int = Field(10_000, gt=0, le=1 << 24)
    seq_len: int = Field(512, gt=0, le=1 << 20)
    batch: int = Field(8, gt=0, le=1 << 20, description="sequences per step, over all devices")
    devices: int = Field(8, gt=0, le=1 << 16)
    memory_gb: float | None = Field(None, gt=0, allow_inf_nan=False, description="per device")
    tflops: float | None = Field(None, gt=0, allow_inf_nan=False, description="per device")
    bandwidth_gbps: float | None = Field(None, gt=0, allow_inf_nan=False, description="per device")
    overlap: bool = True
    checkpointing: bool = False

    @field_validator("num_heads")
    @classmethod
    def _heads_divide_width(cls, v: int | None, info: ValidationInfo) -> int | None:
        d_model = info.data.get("d_model")
        if v is not None and d_model is not None and d_model % v:
            raise ValueError(f"num_heads ({v}) must divide d_model ({d_model})")
        return v

    @classmethod
    def from_form(cls, fields) -> PlanQuery:
        """From a form's fields (strings; an empty one is left out), or a 422 that names each bad field
        as a query parameter, as FastAPI's own validation does."""
        try:
            return cls.model_validate({k: v for k, v in fields.items() if k in cls.model_fields and v.strip()})
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("query", *e["loc"])}
                                          for e in exc.errors(include_url=False, include_context=False)]) from None


def make_plan(db, q: PlanQuery) -> dict:
    from kernels.names import MODEL_SIZES  # torch-free; imported here as the backend's import rule asks

    size, memory_gb, tflops, bandwidth_gbps = q.size, q.memory_gb, q.tflops, q.bandwidth_gbps
    if size == "custom":
        dims = (q.d_model, q.d_ff, q.num_layers, q.num_heads)
        if any(x is None for x in dims):
            raise invalid_query("size", "size=custom needs d_model, d_ff, num_layers and num_heads")
    elif size in MODEL_SIZES:
        s = MODEL_SIZES[size]
        dims = (s.d_model, s.d_ff, s.num_layers, s.num_heads)
    else:
        raise invalid_query("size", f"unknown size {size!r}; choose from {', '.join(MODEL_SIZES)}, custom")
    measured = measured_inputs(db)
    sources = {
        "flops": "entered" if tflops else measured.get("flops", {}).get("source", "H200 datasheet (dense bf16)"),
        "bandwidth": "entered" if bandwidth_gbps else measured.get("bandwidth", {}).get(
            "source", "H200 datasheet (NVLink, per direction)"),
        "memory": "entered" if memory_gb else "H200 (141 GB)"}
    c = Cluster(q.devices, (memory_gb or REFERENCE_MEMORY_GB) * 1e9,
                (tflops or measured.get("flops", {}).get("tflops") or REFERENCE_TFLOPS) * 1e12,
                (bandwidth_gbps or measured.get("bandwidth", {}).get("gbps") or REFERENCE_GBPS) * 1e9, q.overlap)
    result = plan(Model(*dims, vocab_size=q.vocab_size, seq_len=q.seq_len), q.batch, c, checkpointing=q.checkpointing)
    result["sources"] = sources
    measured_rows = []
    for sweep in db.exec(select(Sweep).where(Sweep.suite.in_(("ddp", "leaderboard")))
                         .order_by(Sweep.id.desc()).limit(20)).all():
        measured_rows += service.result_rows(db, sweep.id)
    result["measured"] = predict_measured(measured_rows, c)
    return result


class PlanPublic(SQLModel):
    model: dict[str, Any]
    batch: int
    tokens: int
    cluster: dict[str, Any]
    precision: dict[str, Any]
    checkpointing: bool
    strategies: list[dict[str, Any]]
    fsdp_tp_splits: list[dict[str, Any]]
    best_split: dict[str, Any] | None
    max_devices_before_comm_bound: dict[str, int | None]
    sources: dict[str, str]
    measured: list[dict[str, Any]]


@router.get("/plan", response_model=PlanPublic)
def get_plan(db: SessionDep, q: Annotated[PlanQuery, Query()]) -> dict:
    """FLOPs, communication, time and memory per device for DP, FSDP, TP and every FSDP+TP split on
    `devices` devices; the largest device count before each becomes communication-bound; and
    benchlab's measured ddp cells beside their predictions. C and W: as entered, else measured, else
    the H200's datasheet (`sources` says which)."""
    return make_plan(db, q)
