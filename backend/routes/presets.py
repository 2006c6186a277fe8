"""/api/presets: studies of several sweeps created in one call (backend/presets.py)."""
from __future__ import annotations

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel

from backend import service
from backend.deps import DispatcherDep, ReadAuth, SessionDep, SettingsDep, WriteAuth
from backend.errors import BROKER_DOWN, NOT_FOUND
from backend.presets import PRESETS

router = APIRouter(prefix="/api/presets", tags=["presets"])


class PresetPublic(BaseModel):
    name: str
    description: str
    sweeps: list[str]


class PresetCreated(BaseModel):
    name: str
    sweeps: list[int]
    open: str


@router.get("", dependencies=[ReadAuth], response_model=list[PresetPublic])
def list_presets() -> list[dict]:
    return [{"name": n, "description": d, "sweeps": [s.name or s.suite for s in sweeps]}
            for n, (d, sweeps) in PRESETS.items()]


@router.post("/{name}", status_code=201, dependencies=[WriteAuth], response_model=PresetCreated,
             responses={**NOT_FOUND, **BROKER_DOWN})
def create_preset(db: SessionDep, settings: SettingsDep, dispatcher: DispatcherDep,
                  name: str = Path(max_length=100)) -> dict:
    """Create the preset's sweeps, in order; `open` is the page of the last (the study's chart)."""
    if name not in PRESETS:
        raise HTTPException(404, detail=f"no preset {name!r}; presets: {', '.join(PRESETS)}")
    ids = [service.create_sweep(db, dispatcher, body, settings, source="preset")[0].id for body in PRESETS[name][1]]
    return {"name": name, "sweeps": ids, "open": f"/sweeps/{ids[-1]}"}
