"""Sweep validation and grid expansion (pure functions, no database).

params {name: value or [values]}: a list is a grid axis; the grid is the Cartesian product of
the axes in the order given, the first axis varying slowest. params may also be a list of such
objects: the sweep is then their grids one after another (a cell that appears twice runs once), e.g.
[{"wrapper": "bucketed", "bucket_size_mb": [1, 10]}, {"wrapper": ["naive", "flat"]}].
Every cell is validated against the suite's params model before anything is stored, and errors
name the field.
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Any

from pydantic import ValidationError

from worker.suites import cell_dict, get_suite, suite_names


class SweepInputError(ValueError):
    """Bad sweep input; `errors` is a list of {"loc": [...], "msg": str} naming each bad field."""

    def __init__(self, errors: list[dict[str, Any]]):
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))


def _err(loc: list, msg: str, type_: str = "value_error") -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": type_}


def grid_size(params: dict[str, Any] | list[dict[str, Any]]) -> int:
    if isinstance(params, list):
        return sum(grid_size(p) for p in params if isinstance(p, dict))
    return math.prod(len(v) if isinstance(v, list) else 1 for v in params.values())


def expand_grid(suite: str, params: dict[str, Any] | list[dict[str, Any]], max_cells: int) -> list[dict[str, Any]]:
    """Validate and expand `params` into cells (each a full, validated params dict, defaults filled)."""
    if suite not in suite_names():
        raise SweepInputError([_err(["body", "suite"],
                                    f"unknown suite {suite!r}; known suites: {', '.join(suite_names())}")])
    if isinstance(params, list):
        if not params or not all(isinstance(p, dict) for p in params):
            raise SweepInputError([_err(["body", "params"], "a list of grids must hold one or more objects")])
        if grid_size(params) > max_cells:
            raise SweepInputError([_err(["body", "params"], f"the grids have {grid_size(params)} cells, more "
                                                            f"than the limit of {max_cells}")])
        cells, seen, errors = [], set(), []
        for i, grid in enumerate(params):
            try:
                part = expand_grid(suite, grid, max_cells)
            except SweepInputError as exc:  # every grid's errors, each located by its index
                errors += [{**e, "loc": [*e["loc"][:2], i, *e["loc"][2:]]} for e in exc.errors]
                continue
            for cell in part:
                key = json.dumps(cell, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    cells.append(cell)
        if errors:
            raise SweepInputError(errors)
        return cells
    if not isinstance(params, dict):
        raise SweepInputError([_err(["body", "params"], "params must be an object of {name: value or [values]}")])
    model = get_suite(suite).Params
    known = {(f.alias or name) for name, f in model.model_fields.items()} | set(model.model_fields)
    public = [f.alias or n for n, f in model.model_fields.items()]
    errors = []
    for name, value in params.items():
        if name not in known:
            errors.append(_err(["body", "params", name], f"unknown parameter {name!r} for suite {suite!r}; "
                                                         f"known: {', '.join(sorted(public))}"))
        elif isinstance(value, list) and not value:
            errors.append(_err(["body", "params", name], "empty grid axis: give at least one value"))
        elif isinstance(value, list) and len({json.dumps(v, sort_keys=True) for v in value}) < len(value):
            errors.append(_err(["body", "params", name], f"grid axis {name!r} lists a value more than once: give "
                                                         "each once, and `repeats` to run every cell several times"))
    if errors:
        raise SweepInputError(errors)
    size = grid_size(params)
    if size > max_cells:
        raise SweepInputError([_err(["body", "params"],
                                    f"the grid has {size} cells, more than the limit of {max_cells}")])

    names = list(params)
    axes = [params[n] if isinstance(params[n], list) else [params[n]] for n in names]
    cells, seen_errors = [], {}
    for combo in itertools.product(*axes):
        raw = dict(zip(names, combo, strict=True))
        try:
            cells.append(cell_dict(model.model_validate(raw)))
        except ValidationError as exc:
            for e in exc.errors():
                loc = ["body", "params", *[str(x) for x in e["loc"]]]
                bad = raw.get(str(e["loc"][0])) if e["loc"] else None
                msg = e["msg"] + (f" (got {bad!r})" if e["loc"] and str(e["loc"][0]) in raw else "")
                seen_errors.setdefault((tuple(loc), msg), _err(loc, msg, e.get("type", "value_error")))
            if len(seen_errors) >= 20:
                break
    if seen_errors:
        raise SweepInputError(list(seen_errors.values()))
    keys = [json.dumps(c, sort_keys=True) for c in cells]
    if len(set(keys)) < len(keys):  # e.g. bucket_size_mb [1, 1.0]: two spellings of one value
        raise SweepInputError([_err(["body", "params"], "the grid holds a cell more than once: an axis lists one "
                                                        "value twice, written two ways (such as 1 and 1.0)")])
    return cells
