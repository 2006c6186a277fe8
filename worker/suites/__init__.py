"""The suite registry.

A suite is one module with:
- `Params`: a torch-free pydantic model of one cell's parameters (the API validates sweeps and
  draws the form from its JSON Schema without importing torch),
- `DESCRIPTION`: one line for the API and the form,
- `run(params, ctx) -> dict[str, float | ...]`: measures one cell (imports torch inside) and
  returns its metrics; raises `worker.harness.SkipCell` for an unsupported configuration.
Adding a suite is that module plus one line in `_MODULES` below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from pydantic import BaseModel

_MODULES = {
    "attention": "worker.suites.attention",
    "model": "worker.suites.model",
    "ddp": "worker.suites.ddp",
    "allreduce": "worker.suites.allreduce",
    "leaderboard": "worker.suites.leaderboard",
    "noop": "worker.suites.noop",
}


@dataclass
class CellContext:
    """What a running cell may use besides its params: where to put artifacts, how to report progress."""

    artifact_dir: Path
    progress: Callable[[str], None] = field(default=lambda msg: None)

    def artifact(self, name: str) -> Path:
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        return self.artifact_dir / name


def suite_names() -> list[str]:
    return list(_MODULES)


def get_suite(name: str) -> ModuleType:
    """The suite module called `name`; KeyError with the known names otherwise."""
    if name not in _MODULES:
        raise KeyError(f"unknown suite {name!r}; known suites: {', '.join(_MODULES)}")
    return importlib.import_module(_MODULES[name])


def params_model(name: str) -> type[BaseModel]:
    return get_suite(name).Params


def validate_cell(name: str, cell: dict[str, Any]) -> BaseModel:
    """Validate one cell's params (raises pydantic.ValidationError naming the field)."""
    return params_model(name).model_validate(cell)


def cell_dict(params: BaseModel) -> dict[str, Any]:
    """A validated cell as a plain dict, defaults filled in, by public (alias) names."""
    return params.model_dump(mode="json", by_alias=True)
