from __future__ import annotations

import time

from fastapi import APIRouter, Request

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
def health(request: Request) -> dict:
    rec = request.app.state.recorder
    return {"status": "ok", "time": time.time(), "broker": request.app.state.dispatcher.worker_settings.effective_broker_url.split("@")[-1],
            "recorder": bool(rec and rec.is_alive()), "events_recorded": rec.applied if rec else 0}
