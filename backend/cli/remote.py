"""Commands that talk to a server: `submit`, `ci` (submit, wait, judge against a baseline) and `compare`."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import typer

from backend.cli.common import (
    app,
    console,
    fraction,
    load_spec,
    out,
    refusal,
    seconds,
    summary_table,
)
from worker.contract import FAILED_STATES, UNFINISHED_STATUSES


@app.command()
def submit(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or YAML sweep spec"),
           server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
           token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
           wait: bool = typer.Option(False, "--wait", help="wait for the sweep; exit 1 if any cell failed"),
           poll_s: float = typer.Option(1.0, callback=seconds),
           timeout_s: float = typer.Option(24 * 3600.0, callback=seconds)) -> None:
    """Submit a sweep (the POST /api/sweeps body) to a server."""
    import httpx

    body = load_spec(spec)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        _submit(body, server, headers, wait, poll_s, timeout_s)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None


def _wait_for(client, sweep_id: int, timeout_s: float, poll_s: float, exit_code: int = 3) -> dict:
    """Wait until the sweep has no queued or running cell (held waits; polling if the server answers
    at once), printing its counts as they change; the summary. Exit `exit_code` past `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        # the server holds the answer until the sweep finishes (or wait_s passes)
        hold = max(0.0, min(30.0, deadline - time.monotonic()))
        asked = time.monotonic()
        s = client.get(f"/api/sweeps/{sweep_id}", params={"wait_s": hold}).json()
        counts = {k: v for k, v in s["counts"].items() if v}
        if counts != last:
            console.print(f"sweep {sweep_id}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
            last = counts
        if s["status"] not in UNFINISHED_STATUSES:
            return s
        if time.monotonic() > deadline:
            console.print("[red]timed out waiting[/]")
            raise typer.Exit(exit_code)
        if time.monotonic() - asked < hold / 2:  # a server that answers at once: poll
            time.sleep(poll_s)


def _submit(body: dict, server: str, headers: dict, wait: bool, poll_s: float, timeout_s: float) -> None:
    import httpx

    with httpx.Client(base_url=server, headers=headers, timeout=60) as client:
        r = client.post("/api/sweeps", json=body)
        if r.status_code != 201:
            console.print(f"[red]rejected ({r.status_code}):[/] {refusal(r)}")
            raise typer.Exit(2)
        sweep = r.json()
        console.print(f"sweep {sweep['id']}: {sweep['jobs']} jobs queued  {server}/sweeps/{sweep['id']}")
        out.print(json.dumps(sweep))
        if not wait:
            return
        s = _wait_for(client, sweep["id"], timeout_s, poll_s)
        rows = client.get(f"/api/sweeps/{sweep['id']}/results").json()
    out.print(summary_table(body["suite"], rows))
    bad = sum(s["counts"][k] for k in FAILED_STATES)
    if bad:
        console.print(f"[red]{bad} cell(s) failed, ran out of memory or timed out[/]")
        raise typer.Exit(1)


def _report_comparison(result: dict, heading: str, json_out: Path | None, markdown_out: Path | None,
                       no_match: str) -> None:
    """Print (and write) a comparison; exit 2 when no cell matched, 1 when a cell is slower."""
    from backend.compare import markdown

    table = heading + markdown(result)
    out.print(table, markup=False, highlight=False)
    if json_out:
        json_out.write_text(json.dumps(result, indent=1))
    if markdown_out:
        markdown_out.write_text(table + "\n")
    if not result["cells"]:
        console.print(f"[red]{no_match}[/]", markup=True)
        raise typer.Exit(2)
    if result["summary"]["slower"]:
        raise typer.Exit(1)


@app.command()
def ci(spec: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or YAML sweep spec (as submit)"),
       server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
       token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
       baseline: str = typer.Option("auto", help="auto (the newest finished sweep of the same suite and grid on "
                                                 "--baseline-branch) or a sweep id"),
       baseline_branch: str = typer.Option("main"),
       threshold: float = typer.Option(0.05, help="relative: 0.05 is 5 %", callback=fraction),
       ignore: str = typer.Option("", help="comma-separated params not matched on"),
       confirm: bool = typer.Option(False, "--confirm", help="run the cells judged slower once more (beside the "
                                                             "baseline's configuration where it differs only in "
                                                             "ignored params); slower stands only if confirmed"),
       json_out: Optional[Path] = typer.Option(None, "--json"),
       markdown_out: Optional[Path] = typer.Option(None, "--markdown"),
       timeout_s: float = typer.Option(6 * 3600.0, callback=seconds),
       poll_s: float = typer.Option(1.0, callback=seconds)) -> None:
    """Run a sweep and judge it against its baseline. Exit 0: no cell slower; 1: a cell slower; 2: could
    not judge (a cell failed, OOMed or timed out, no baseline, server unreachable, bad token)."""
    import httpx

    from backend.ci import ci_tags, find_baseline

    body = load_spec(spec)
    body["tags"] = {**ci_tags(os.environ), **(body.get("tags") or {})}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ignored = [p.strip() for p in ignore.split(",") if p.strip()]
    try:
        with httpx.Client(base_url=server, headers=headers, timeout=120) as client:
            if baseline == "auto":
                listed = client.get("/api/sweeps", params={"limit": 1000})
                if listed.status_code != 200:
                    console.print(f"[red]cannot list sweeps ({listed.status_code}):[/] {refusal(listed)}")
                    raise typer.Exit(2)
                base = find_baseline(listed.json(), body["suite"], body.get("params") or {}, ignored,
                                     baseline_branch)
                base_id = base["id"] if base else None
            else:  # a sweep named by id: there, and of this suite, before anything is submitted
                base_id = int(baseline) if baseline.isdigit() and int(baseline) > 0 else None
                if base_id is None:
                    console.print(f"[red]bad input:[/] --baseline is auto or a sweep id, got {baseline!r}")
                    raise typer.Exit(2)
                found = client.get(f"/api/sweeps/{base_id}")
                if found.status_code != 200:
                    console.print(f"[red]cannot use baseline {base_id} ({found.status_code}):[/] {refusal(found)}; "
                                  "nothing was submitted")
                    raise typer.Exit(2)
                theirs = found.json().get("suite")
                if theirs != body.get("suite"):
                    console.print(f"[red]bad input:[/] baseline {base_id} ran the {theirs} suite and {spec} runs the "
                                  f"{body.get('suite')} suite; nothing was submitted")
                    raise typer.Exit(2)
            r = client.post("/api/sweeps", json=body)
            if r.status_code != 201:
                console.print(f"[red]rejected ({r.status_code}):[/] {refusal(r)}")
                raise typer.Exit(2)
            sid = r.json()["id"]
            console.print(f"sweep {sid} ({r.json()['jobs']} jobs) {server}/sweeps/{sid}; tags {body['tags']}")
            summary = _wait_for(client, sid, timeout_s, poll_s, exit_code=2)
            bad = {k: summary["counts"][k] for k in FAILED_STATES if summary["counts"][k]}
            if bad:
                console.print(f"[red]cannot judge: {bad} cell(s) of sweep {sid}[/]")
                raise typer.Exit(2)
            if base_id is None:
                console.print(f"[red]cannot judge: no finished {body['suite']} sweep of this grid on branch "
                              f"{baseline_branch!r} to compare with[/] (this one, {sid}, can be the next baseline)")
                raise typer.Exit(2)
            result = _compare_or_exit(client, base_id, sid, threshold, ignored)
            if confirm and result["summary"]["slower"]:
                result = _confirm(client, result, body, base_id, sid, threshold, ignored, timeout_s, poll_s)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None
    _report_comparison({**result, "baseline": base_id, "sweep": sid},
                       f"benchlab: sweep {sid} against baseline {base_id}\n\n", json_out, markdown_out,
                       "cannot judge: no cell matches the baseline's")


def _compare_or_exit(client, a: int, b: int, threshold: float, ignored: list[str]) -> dict:
    c = client.get("/api/compare", params={"a": a, "b": b, "threshold": threshold, "ignore": ",".join(ignored)})
    if c.status_code != 200:
        console.print(f"[red]comparison refused ({c.status_code}):[/] {refusal(c)}")
        raise typer.Exit(2)
    return c.json()


def _confirm(client, result: dict, body: dict, base_id: int, sid: int, threshold: float, ignored: list[str],
             timeout_s: float, poll_s: float) -> dict:
    """Run the cells judged slower again (and the baseline's cells beside them, when they differ only in
    ignored params, so both run on this server now); keep `slower` only where the rerun is slower too."""
    def key(params: dict) -> str:
        return json.dumps({k: v for k, v in params.items() if k not in ignored}, sort_keys=True)

    slower = {key(c["params"]) for c in result["cells"] if c["verdict"] == "slower"}

    def cells_of(sweep_id: int) -> list[dict]:
        rows = client.get(f"/api/sweeps/{sweep_id}/results").json()
        unique = {json.dumps(r["params"], sort_keys=True): r["params"] for r in rows if key(r["params"]) in slower}
        return list(unique.values())

    def rerun(cells: list[dict], of: int) -> int:
        again = {k: v for k, v in body.items() if k in ("suite", "repeats", "queue", "timeout_s", "name")}
        again.update(params=cells, tags={**(body.get("tags") or {}), "confirms": str(of)})
        r = client.post("/api/sweeps", json=again)
        if r.status_code != 201:
            console.print(f"[red]confirmation rejected ({r.status_code}):[/] {refusal(r)}")
            raise typer.Exit(2)
        return r.json()["id"]

    new_cells, base_cells = cells_of(sid), cells_of(base_id)
    both = sorted(json.dumps(c, sort_keys=True) for c in new_cells) != sorted(json.dumps(c, sort_keys=True)
                                                                            for c in base_cells)
    again_base = rerun(base_cells, base_id) if both else base_id
    again_new = rerun(new_cells, sid)
    console.print(f"confirming {len(slower)} slower cell(s): sweep {again_new}"
                  + (f" beside the baseline's configuration, sweep {again_base}" if both else
                     f" against baseline {base_id}"))
    for s_id in {again_base, again_new} - {base_id}:
        summary = _wait_for(client, s_id, timeout_s, poll_s, exit_code=2)
        bad = {k: summary["counts"][k] for k in FAILED_STATES if summary["counts"][k]}
        if bad:
            console.print(f"[red]cannot judge: {bad} cell(s) of confirmation sweep {s_id}[/]")
            raise typer.Exit(2)
    second = _compare_or_exit(client, again_base, again_new, threshold, ignored)
    confirmed = {key(c["params"]) for c in second["cells"] if c["verdict"] == "slower"}
    for c in result["cells"]:
        if c["verdict"] == "slower":
            c["confirmed"] = key(c["params"]) in confirmed
            if not c["confirmed"]:
                c["verdict"] = "inconclusive"
                c["reason"] = f"slower at first, not when run again (sweep {again_new})"
    result["summary"] = {v: sum(1 for c in result["cells"] if c["verdict"] == v) for v in result["summary"]}
    result["confirmation"] = {"sweep": again_new, "baseline": again_base, "result": second}
    return result




@app.command("compare")
def compare_cmd(a: int = typer.Argument(..., help="sweep A (the baseline)"),
                b: int = typer.Argument(..., help="sweep B"),
                server: str = typer.Option("http://127.0.0.1:8000", envvar="BENCHLAB_SERVER"),
                token: Optional[str] = typer.Option(None, envvar="BENCHLAB_API_TOKEN"),
                threshold: float = typer.Option(0.05, help="relative: 0.05 is 5 %", callback=fraction),
                ignore: str = typer.Option("", help="comma-separated params not matched on, e.g. impl"),
                allow_env_mismatch: bool = typer.Option(False, help="judge cells whose environments differ"),
                json_out: Optional[Path] = typer.Option(None, "--json", help="write the comparison as JSON"),
                markdown_out: Optional[Path] = typer.Option(None, "--markdown", help="write the table as markdown")
                ) -> None:
    """Compare two sweeps cell by cell; print a markdown table. Exit 0: no cell slower; 1: a cell slower;
    2: could not compare (server unreachable, bad token, no such sweep, no matching cells)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{server.rstrip('/')}/api/compare", headers=headers, timeout=120,
                      params={"a": a, "b": b, "threshold": threshold, "ignore": ignore,
                              "allow_env_mismatch": allow_env_mismatch})
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach the server {server}:[/] {exc}")
        raise typer.Exit(2) from None
    if r.status_code != 200:
        console.print(f"[red]comparison refused ({r.status_code}):[/] {refusal(r)}")
        raise typer.Exit(2)
    _report_comparison(r.json(), "", json_out, markdown_out,
                       "no cell of A matches a cell of B (name the params that differ with --ignore)")
