from __future__ import annotations

from fastapi import APIRouter

from backend.deps import ReadAuth
from worker.suites import get_suite, suite_names

router = APIRouter(prefix="/api/suites", tags=["suites"], dependencies=[ReadAuth])


def suite_info(name: str) -> dict:
    mod = get_suite(name)
    return {"name": name, "description": mod.DESCRIPTION, "schema": mod.Params.model_json_schema(by_alias=True)}


@router.get("")
def list_suites() -> list[dict]:
    return [suite_info(n) for n in suite_names()]
