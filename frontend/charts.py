"""Plotly figure builders for the pages. They take plain rows (dicts), never database objects.

A row is {"params": {...}, "metrics": {...}, "state": str, "error": str | None}; `flatten` merges
params and metrics into one dict so builders can address any field by name.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any, Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

PROBLEM_STATES = ("oom", "skipped", "failed", "timeout")
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
METRIC_KEYS = ("median_ms", "mean_ms", "p20_ms", "p80_ms", "tflops", "peak_mem_bytes")


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    flat = {**row.get("params", {}), **(row.get("metrics") or {})}
    flat["state"] = row.get("state")
    flat["error"] = row.get("error")
    flat["job_id"] = row.get("job_id")
    return flat


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def pool_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell where a sweep ran cells more than once (its `repeats`).

    A cell's finished runs become one row: each numeric metric is the median of the runs' values, with
    `runs` (how many) and `runs_range` ({metric: [lowest, highest]}); the rest (lists, dicts) comes from
    the run of median `median_ms`. Such a cell is host-bound when at least half of its runs were. A run
    that did not finish stays a row of its own, so the charts still mark it. Rows of cells run once
    are returned as they are. Cells are told apart by `cell` and their params together, so the cells
    of several sweeps' files read as one (each numbering its cells from 0) stay apart.
    """
    out, by_cell = [], {}
    for r in rows:
        if r.get("state") == "done" and r.get("metrics"):
            key = json.dumps([r.get("cell"), r.get("params")], sort_keys=True)
            by_cell.setdefault(key, []).append(r)
        else:
            out.append(r)
    for runs in by_cell.values():
        if len(runs) == 1:
            out.append(runs[0])
            continue
        middle = sorted(runs, key=lambda r: r["metrics"]["median_ms"] if _number(r["metrics"].get("median_ms"))
                        else 0.0)[(len(runs) - 1) // 2]
        metrics, ranges = dict(middle["metrics"]), {}
        for k in {k for r in runs for k in r["metrics"]}:
            values = [r["metrics"][k] for r in runs if _number(r["metrics"].get(k))]
            if values:
                metrics[k], ranges[k] = statistics.median(values), [min(values), max(values)]
        if any("host_bound" in r["metrics"] for r in runs):
            metrics["host_bound"] = 2 * sum(bool(r["metrics"].get("host_bound")) for r in runs) >= len(runs)
        out.append({**middle, "metrics": {**metrics, "runs": len(runs), "runs_range": ranges}})
    return out


def varying(rows: list[dict[str, Any]], keys: Iterable[str]) -> list[str]:
    """The keys among `keys` that take more than one value across rows."""
    return [k for k in keys if len({json.dumps(r.get(k), sort_keys=True) for r in rows}) > 1]


def _label(row: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={row.get(k)}" for k in keys) if keys else "all"


def _sort_key(v):
    return (0, v) if isinstance(v, (int, float)) else (1, str(v))


def series_colors(rows: list[dict[str, Any]], series: list[str]) -> dict[str, str]:
    """A colour per series label (`_label` of the series params), from every row of a page: the charts
    of one page then draw a series in one colour, even where a chart lacks some of them (the speed-up
    over naive has no naive line)."""
    labels = sorted({_label(r, series) for r in rows}, key=str)
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


def facet_lines(rows: list[dict[str, Any]], x: str, y: str, series: list[str], facets: list[str], title: str,
                y_title: str, log_x: bool = True, log_y: bool = False, scale: float = 1.0,
                marks_alone: bool = True, colors: dict[str, str] | None = None) -> go.Figure | None:
    """One subplot per facet value, one line per series value; OOM/skipped/failed cells drawn as x markers,
    host-bound cells hollow with their GPU-busy share in the hover. None when there is nothing to draw, or
    (marks_alone=False) when no finished cell has the metric: a chart of a figure only some devices
    record (peak memory, which CPU cells leave empty) is left out rather than drawn with marks alone.
    `colors` (series_colors of the page's rows) keeps a series' colour the same across a page's charts."""
    done = [r for r in rows if r.get("state") == "done" and isinstance(r.get(y), (int, float))]
    bad = [r for r in rows if r.get("state") in PROBLEM_STATES]
    if not done and (not bad or not marks_alone):
        return None
    facet_vals = sorted({_label(r, facets) for r in done + bad}, key=str)
    cols = min(len(facet_vals), 3)
    nrows = -(-len(facet_vals) // cols)
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=facet_vals if facets else None,
                        horizontal_spacing=0.08, vertical_spacing=0.12)
    series_vals = sorted({_label(r, series) for r in done + bad}, key=str)
    colors = colors or series_colors(done + bad, series)
    shown: set[str] = set()
    for fi, fv in enumerate(facet_vals):
        rr, cc = fi // cols + 1, fi % cols + 1
        facet_done = [r for r in done if _label(r, facets) == fv]
        top = max((r[y] * scale for r in facet_done), default=1.0)
        for sv in series_vals:
            pts = sorted((r for r in facet_done if _label(r, series) == sv), key=lambda r: _sort_key(r.get(x)))
            if pts:
                # error bars: a repeated cell's range of runs, else p20-p80 of a time, else a recorded interval
                bounds = None
                if any(r.get("runs", 1) > 1 for r in pts):
                    bounds = [(r.get("runs_range") or {}).get(y, [r[y], r[y]]) for r in pts]
                elif y == "median_ms" and all("p20_ms" in r and "p80_ms" in r for r in pts):
                    bounds = [(r["p20_ms"], r["p80_ms"]) for r in pts]
                elif all(isinstance(r.get(f"{y}_low"), (int, float)) and isinstance(r.get(f"{y}_high"), (int, float))
                         for r in pts):  # a figure recorded with its interval (speedup_vs_against)
                    bounds = [(r[f"{y}_low"], r[f"{y}_high"]) for r in pts]
                err = None if bounds is None else dict(
                    type="data", symmetric=False, thickness=1,
                    array=[(hi - r[y]) * scale for r, (_, hi) in zip(pts, bounds, strict=True)],
                    arrayminus=[(r[y] - lo) * scale for r, (lo, _) in zip(pts, bounds, strict=True)])
                notes = [_host_bound_note(r) for r in pts]
                hover = ["; ".join(filter(None, (_runs_note(r, y, scale), n))) for r, n in zip(pts, notes, strict=True)]
                fig.add_trace(go.Scatter(x=[r.get(x) for r in pts], y=[r[y] * scale for r in pts], mode="lines+markers",
                                         name=sv, legendgroup=sv, showlegend=sv not in shown, error_y=err,
                                         line=dict(color=colors[sv]), hovertext=hover,
                                         marker=dict(symbol=["circle-open" if n else "circle" for n in notes])),
                              row=rr, col=cc)
                shown.add(sv)
            marks = [r for r in bad if _label(r, facets) == fv and _label(r, series) == sv]
            if marks:
                fig.add_trace(go.Scatter(
                    x=[r.get(x) for r in marks], y=[top] * len(marks), mode="markers+text",
                    marker=dict(symbol="x", size=11, color=colors[sv]), text=[r["state"] for r in marks],
                    textposition="top center", name=f"{sv} ({'/'.join(sorted({r['state'] for r in marks}))})",
                    legendgroup=sv, showlegend=True,
                    hovertext=[(r.get("error") or r["state"])[:200] for r in marks], hoverinfo="text+x"),
                    row=rr, col=cc)
        fig.update_xaxes(title_text=x, type="log" if log_x else None, row=rr, col=cc)
        fig.update_yaxes(title_text=y_title, type="log" if log_y else None, row=rr, col=cc)
    runs = max((r.get("runs", 1) for r in done), default=1)
    if runs > 1:  # pool_runs: each point is a median over runs, its bar their range
        title += f" (cells run up to {runs} times: medians of the runs, bars their range)"
    fig.update_layout(title=title, height=max(380, 330 * nrows), margin=dict(t=70, l=60, r=20, b=90),
                      legend=dict(orientation="h", yanchor="top", y=-0.22 / nrows))
    return fig


def ratio_rows(rows: list[dict[str, Any]], key: str, baseline: str, metric: str = "median_ms") -> list[dict[str, Any]]:
    """For each done row whose `key` != baseline, add speedup = baseline's metric / this metric on matching params."""
    def match_key(r):
        return json.dumps({k: v for k, v in r["_params"].items() if k != key}, sort_keys=True)

    base = {match_key(r): r[metric] for r in rows if r.get(key) == baseline and r.get("state") == "done"
            and isinstance(r.get(metric), (int, float))}
    out = []
    for r in rows:
        if r.get(key) == baseline or r.get("state") != "done" or match_key(r) not in base:
            continue
        if isinstance(r.get(metric), (int, float)) and r[metric] > 0:
            out.append({**r, "speedup": base[match_key(r)] / r[metric]})
    return out


def _prepare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    flat = []
    for r in rows:
        f = flatten(r)
        f["_params"] = r.get("params", {})
        flat.append(f)
    return flat


def attention_figures(rows: list[dict[str, Any]]) -> list[go.Figure]:
    flat = _prepare(rows)
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params)
    facets = [k for k in ("d_head", "dtype", "causal", "pass") if k in var]
    series = [k for k in var if k not in facets and k not in ("seq_len", "warmup", "repeats")] or ["impl"]
    colors = series_colors(flat, series)
    figs = [
        facet_lines(flat, "seq_len", "median_ms", series, facets, "Latency vs sequence length", "ms (median, p20-p80)",
                    log_y=True, colors=colors),
        facet_lines(flat, "seq_len", "tflops", series, facets, "Throughput vs sequence length", "TFLOP/s", log_y=False,
                    colors=colors),
        facet_lines(flat, "seq_len", "peak_mem_bytes", series, facets, "Peak memory vs sequence length", "MiB",
                    log_y=True, scale=1 / 2**20, marks_alone=False, colors=colors),
    ]
    paired = [r for r in flat if r.get("against") and "speedup_vs_against" in r]
    against = sorted({str(r["against"]) for r in paired})
    if against:  # cells that timed a second implementation with impl: in turns, or each alone (sustain_ms)
        sustained = {bool(r.get("sustain_ms")) for r in paired}
        how = ("timed in turns or alone (sustain_ms)" if len(sustained) > 1
               else "each timed alone (sustained)" if True in sustained else "timed in turns")
        name = against[0] if len(against) == 1 else "the implementation timed with it (against)"
        figs.append(facet_lines(flat, "seq_len", "speedup_vs_against", series, facets,
                                f"Speed-up over {name}, {how}", "x faster (95 % interval)", colors=colors))
    if any(r.get("impl") == "naive" for r in flat) and len({r.get("impl") for r in flat}) > 1:
        sp = ratio_rows(flat, "impl", "naive")
        if sp:
            figs.append(facet_lines(sp, "seq_len", "speedup", [s for s in series if s != "state"], facets,
                                    "Speed-up over naive attention", "x faster than naive", colors=colors))
    return [f for f in figs if f is not None]


def model_figures(rows: list[dict[str, Any]]) -> list[go.Figure]:
    flat = _prepare(rows)
    figs: list[go.Figure | None] = []
    done = [r for r in flat if r.get("state") == "done"]
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params)
    # stacked forward / backward / optimizer per configuration (every varying param but the scope),
    # from the three scopes
    config = [k for k in var if k != "scope"]
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for r in done:
        label = (_label(r, config) if config else
                 f"{r.get('size')} {r.get('precision')}{' compiled' if r.get('compile') else ''}")
        groups[label][r.get("scope")] = r.get("median_ms")
    stacked = {k: v for k, v in groups.items() if "fwd" in v and ("fwd_bwd" in v or "step" in v)}
    if stacked:
        labels = list(stacked)
        fwd = [stacked[k]["fwd"] for k in labels]
        bwd = [max(stacked[k].get("fwd_bwd", stacked[k]["fwd"]) - stacked[k]["fwd"], 0) for k in labels]
        opt = [max(stacked[k].get("step", 0) - stacked[k].get("fwd_bwd", stacked[k].get("step", 0)), 0) for k in labels]
        fig = go.Figure([go.Bar(name="forward", x=labels, y=fwd), go.Bar(name="backward", x=labels, y=bwd),
                         go.Bar(name="optimizer", x=labels, y=opt)])
        fig.update_layout(barmode="stack", title="Time per scope (median ms)", yaxis_title="ms")
        figs.append(fig)
    figs.append(_ratio_bar(done, "precision", "fp32", "bf16", "bf16 autocast speed-up over fp32"))
    figs.append(_ratio_bar(done, "compile", False, True, "torch.compile speed-up over eager"))
    if "context_length" in var:
        series = [k for k in var if k not in ("context_length",)] or ["checkpointing"]
        figs.append(facet_lines(flat, "context_length", "peak_mem_bytes", series, [], "Peak memory vs context length",
                                "GiB", scale=1 / 2**30, marks_alone=False))
    else:
        series = [k for k in var if k != "size"]
        figs.append(facet_lines(flat, "size", "median_ms", series or ["scope"], [], "Time vs model size", "ms",
                                log_x=False))
    kb = [r for r in done if isinstance(r.get("kernel_breakdown_ms"), dict)]
    if kb:
        cats = sorted({c for r in kb for c in r["kernel_breakdown_ms"]})
        labels = [f"job {r['job_id']}: " + _label(r, [k for k in var if k != "profile"]) for r in kb]
        fig = go.Figure([go.Bar(name=c, x=labels, y=[r["kernel_breakdown_ms"].get(c, 0) for r in kb]) for c in cats])
        fig.update_layout(barmode="stack", title="Kernel time by category (ms per step)", yaxis_title="ms")
        figs.append(fig)
    return [f for f in figs if f is not None]


def _ratio_bar(done, key, base_val, new_val, title) -> go.Figure | None:
    """new_val's speed-up over base_val of param `key`, one bar per configuration of the other params
    (labelled by those that vary)."""
    pairs = defaultdict(dict)
    for r in done:
        other = json.dumps({k: v for k, v in r["_params"].items() if k != key}, sort_keys=True)
        pairs[other][r.get(key)] = r
    params = [r["_params"] for r in done]
    shown = [k for k in varying(params, params[0]) if k != key] if params else []
    xs, ys = [], []
    for other, d in pairs.items():
        if base_val in d and new_val in d and d[new_val].get("median_ms"):
            o = json.loads(other)
            xs.append(_label(o, shown) if shown else
                      f"{o.get('size')} {o.get('scope')} {o.get('precision', '')}".strip())
            ys.append(d[base_val]["median_ms"] / d[new_val]["median_ms"])
    if not xs:
        return None
    fig = go.Figure(go.Bar(x=xs, y=ys))
    fig.update_layout(title=title, yaxis_title="x faster")
    return fig


BUCKETED = ("bucketed", "zero1", "torch_ddp")  # the wrappers whose step depends on bucket_size_mb


def _runs_note(r: dict[str, Any], y: str, scale: float = 1.0) -> str:
    """'median of 3 runs: 0.21-0.35' for a cell run several times (pool_runs), else ''."""
    lo_hi = (r.get("runs_range") or {}).get(y)
    if r.get("runs", 1) < 2 or not lo_hi:
        return ""
    return f"median of {r['runs']} runs: {lo_hi[0] * scale:.3g}-{lo_hi[1] * scale:.3g}"


def _host_bound_note(r: dict[str, Any]) -> str:
    return f"host-bound: {r['gpu_busy'] * 100:.0f} % GPU busy" if r.get("host_bound") else ""


def _bucket_chart(flat: list[dict[str, Any]], y: str, lo: str | None, hi: str | None, title: str,
                  model: dict[str, Any] | None = None) -> go.Figure | None:
    """y against bucket size (log x) for the bucketed wrappers; the others as horizontal reference lines.
    Host-bound cells are drawn hollow and say so on the chart."""
    done = [r for r in flat if r.get("state") == "done" and isinstance(r.get(y), (int, float))]
    if not done:
        return None
    others = [k for k in varying(flat, list(flat[0]["_params"])) if k not in ("wrapper", "bucket_size_mb")]
    fig = go.Figure()
    series = sorted({(r.get("wrapper"), _label(r, others)) for r in done}, key=str)
    sizes = sorted({r["bucket_size_mb"] for r in done if isinstance(r.get("bucket_size_mb"), (int, float))})
    for i, (wrapper, rest) in enumerate(series):
        pts = sorted((r for r in done if r.get("wrapper") == wrapper and _label(r, others) == rest),
                     key=lambda r: r.get("bucket_size_mb") or 0)
        name = wrapper if not others else f"{wrapper} ({rest})"
        color = PALETTE[i % len(PALETTE)]
        if (wrapper in BUCKETED and len(pts) > 1) or wrapper == "bucketed":
            err = None
            if lo and hi and all(isinstance(r.get(lo), (int, float)) for r in pts):
                err = dict(type="data", symmetric=False, array=[r[hi] - r[y] for r in pts],
                           arrayminus=[r[y] - r[lo] for r in pts], thickness=1)
            notes = [_host_bound_note(r) for r in pts]
            fig.add_trace(go.Scatter(
                x=[r["bucket_size_mb"] for r in pts], y=[r[y] for r in pts], mode="lines+markers+text", name=name,
                error_y=err, line=dict(color=color), text=notes, textposition="top center",
                marker=dict(symbol=["circle-open" if n else "circle" for n in notes], size=9),
                customdata=[[r.get("buckets") or "?", n] for r, n in zip(pts, notes, strict=True)],
                hovertemplate="%{x} MB: %{y:.2f} ms<br>%{customdata[0]} buckets<br>%{customdata[1]}<extra>"
                              + name + "</extra>"))
        else:  # a reference: its median over the sweep, drawn across the bucket sizes
            level = statistics.median(r[y] for r in pts)
            note = next((n for n in map(_host_bound_note, pts) if n), "")
            fig.add_trace(go.Scatter(x=[sizes[0], sizes[-1]] if sizes else [1, 1000], y=[level, level],
                                     mode="lines", name=f"{name} {note}".strip(),
                                     line=dict(color=color, dash="dash"),
                                     hovertemplate=f"{name}: {level:.2f} ms {note}<extra></extra>"))
    if model:
        c = model["curve"]
        fig.add_trace(go.Scatter(
            x=c["bucket_mb"], y=c["exposed_ms"], mode="lines", name="model: s/(n_b w) + n_b o",
            line=dict(color="#333", dash="dot"), customdata=c["buckets"],
            hovertemplate="%{x:.3g} MB: %{y:.2f} ms predicted<br>%{customdata} buckets<extra></extra>"))
        fig.add_vline(x=model["best_bucket_mb"], line=dict(color="#333", dash="dot"),
                      annotation_text=f"predicted best {model['best_bucket_mb']:.3g} MB")
        measured = [r for r in done if r.get("wrapper") == "bucketed"]
        if measured:
            best = min(measured, key=lambda r: r[y])
            fig.add_vline(x=best["bucket_size_mb"], line=dict(color=PALETTE[0], dash="dash"),
                          annotation_text=f"measured best {best['bucket_size_mb']:g} MB", annotation_position="bottom")
        title += (f"<br><sup>model fitted on all-reduce sweep #{model['sweep_id']}: "
                  f"w = {model['w_gbps']:.1f} GB/s, o = {model['o_ms'] * 1000:.1f} us</sup>")
    fig.update_layout(title=title, xaxis=dict(type="log", title="bucket size (MB)"), yaxis_title="ms",
                      height=460, margin=dict(t=90, l=60, r=20, b=60))
    return fig


def _memory_chart(flat: list[dict[str, Any]], var: list[str]) -> go.Figure | None:
    """Stacked bars per rank: parameters, gradients, optimizer state, other; at construction, before the
    optimizer step and after it."""
    done = [r for r in flat if r.get("state") == "done" and isinstance(r.get("memory_by_rank"), list)]
    if not done:
        return None
    parts = ("params", "grads", "optimizer_state", "other")
    stages = (("after_construction", "built"), ("before_step", "before step"), ("after_step", "after step"))
    # two rows of labels: each cell's values of the varying params once, under its ranks and stages
    cells, points, values = [], [], {p: [] for p in parts}
    for r in done:
        for rank, mem in enumerate(r["memory_by_rank"]):
            for key, stage in stages:
                split = mem.get(key) or {}
                cells.append(" ".join(str(r.get(k)) for k in var) or "all")
                points.append(f"r{rank} {stage}")
                for p in parts:
                    values[p].append((split.get(p) or 0) / 2**20)  # `other` is None on CPU
    fig = go.Figure([go.Bar(name=p, x=[cells, points], y=values[p]) for p in parts])
    fig.update_layout(barmode="stack", title="Memory per rank (MiB; each storage counted once)", yaxis_title="MiB",
                      xaxis_title=" / ".join(var) or None, height=560, margin=dict(b=170))
    return fig


def ddp_figures(rows: list[dict[str, Any]], model: dict[str, Any] | None = None) -> list[go.Figure]:
    flat = _prepare(rows)
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params)
    figs = [
        _bucket_chart(flat, "median_ms", "p20_ms", "p80_ms", "Step time vs bucket size (slowest rank, p20-p80)"),
        _bucket_chart(flat, "exposed_comm_ms", "exposed_comm_ci_low", "exposed_comm_ci_high",
                      "Exposed communication vs bucket size (step - same step without communication, 95 % CI)",
                      model),
        _bucket_chart(flat, "comm_ms", "comm_transfer_ms", "comm_ms",
                      "GPU time in collectives per step: the rank with the most (it includes waiting for the "
                      "others),<br>its bar down to the rank with the least (the nearest to the transfers)"),
        _memory_chart(flat, var),
    ]
    return [f for f in figs if f is not None]


def allreduce_figures(rows: list[dict[str, Any]], model: dict[str, Any] | None = None) -> list[go.Figure]:
    flat = _prepare(rows)
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params)
    series = [k for k in var if k != "size_mb"] or ["world_size"]
    colors = series_colors(flat, series)
    latency = facet_lines(flat, "size_mb", "median_ms", series, [], "All-reduce latency", "ms", log_y=True,
                          colors=colors)
    for ws, fit in ((model or {}).get("fits") or {}).items():
        if latency is None:
            break
        sizes = sorted({r["size_mb"] for r in flat if isinstance(r.get("size_mb"), (int, float))})
        xs = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 49) for i in range(50)] if sizes else []
        latency.add_trace(go.Scatter(
            x=xs, y=[fit["o_ms"] + x * 2**20 / (fit["w_gbps"] * 1e9) * 1e3 for x in xs], mode="lines",
            line=dict(color="#333", dash="dot"),
            name=f"fit, {ws} ranks: o = {fit['o_ms'] * 1000:.1f} us, w = {fit['w_gbps']:.1f} GB/s"))
    figs = [facet_lines(flat, "size_mb", "busbw_gbps", series, [], "All-reduce bus bandwidth", "GB/s", colors=colors),
            latency]
    return [f for f in figs if f is not None]


def leaderboard_figures(rows: list[dict[str, Any]]) -> list[go.Figure]:
    """The step split into forward / backward / optimizer per recipe (exposed communication marked),
    and peak memory per GPU with its split; failed and OOM recipes are named under the chart."""
    flat = _prepare(rows)
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params) or ["sharding"]
    done = [r for r in flat if r.get("state") == "done" and isinstance(r.get("median_ms"), (int, float))]
    problems = [f"{_label(r, var)}: {r.get('state')}" for r in flat if r.get("state") in PROBLEM_STATES]
    note = ("<br><sup>" + "; ".join(problems) + "</sup>") if problems else ""
    if not done:
        return []
    labels = [_label(r, var) for r in done]
    step = go.Figure([go.Bar(name=part, x=labels, y=[(r.get(f"{part}_ms") or 0) / 1e3 for r in done])
                      for part in ("forward", "backward", "optimizer")])
    step.add_trace(go.Scatter(
        name="exposed communication", x=labels, y=[(r.get("exposed_comm_ms") or 0) / 1e3 for r in done],
        mode="markers", marker=dict(symbol="line-ew-open", size=30, color="#333"),
        customdata=[[r["median_ms"] / 1e3, r.get("mfu"), r.get("tokens_per_s")] for r in done],
        hovertemplate="exposed comm %{y:.2f} s<br>step %{customdata[0]:.2f} s<br>MFU %{customdata[1]:.1%}"
                      "<br>%{customdata[2]:.0f} tokens/s<extra></extra>"))
    step.update_layout(barmode="stack", title="Training step, slowest rank (s): forward, backward (gradient "
                       "synchronisation included), optimizer" + note, yaxis_title="s", height=480,
                       margin=dict(t=90, b=160))
    parts = ("params", "grads", "optimizer_state", "other")
    mem_labels, values, peaks = [], {p: [] for p in parts}, []
    for r in done:
        for rank, (split, peak) in enumerate(zip(r.get("memory_by_rank") or [], r.get("peak_mem_by_rank") or [],
                                                 strict=False)):
            mem_labels.append(f"{_label(r, var)} | rank {rank}")
            for p in parts:
                values[p].append((split.get(p) or 0) / 2**30)
            peaks.append(peak / 2**30 if peak else None)
    memory = go.Figure([go.Bar(name=p, x=mem_labels, y=values[p]) for p in parts])
    memory.add_trace(go.Scatter(name="peak in the step", x=mem_labels, y=peaks, mode="markers",
                                marker=dict(symbol="line-ew-open", size=30, color="#d62728")))
    memory.update_layout(barmode="stack", title="Memory per GPU (GiB): after a step, and the step's peak",
                         yaxis_title="GiB", height=480, margin=dict(b=160))
    return [step, memory]


def generic_figures(rows: list[dict[str, Any]]) -> list[go.Figure]:
    flat = _prepare(rows)
    params = list(rows[0]["params"]) if rows else []
    var = varying(flat, params)
    numeric = [k for k in var
               if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in flat)]
    metric = next((m for m in METRIC_KEYS if any(isinstance(r.get(m), (int, float)) for r in flat)), None)
    if not numeric or metric is None:
        metric = metric or "value"
        x = "job_id"
        series = var
    else:
        x = numeric[0]
        series = [k for k in var if k != x]
    fig = facet_lines(flat, x, metric, series, [], f"{metric} vs {x}", metric, log_x=False)
    return [fig] if fig is not None else []


FIGURE_BUILDERS = {"attention": attention_figures, "model": model_figures, "ddp": ddp_figures,
                   "allreduce": allreduce_figures, "leaderboard": leaderboard_figures}


def sweep_figures(suite: str, rows: list[dict[str, Any]], model: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Figures for a sweep page as Plotly JSON dicts; `model` is the all-reduce fit the backend found
    (comm_model in backend/service.py), drawn on the ddp and allreduce charts."""
    if not rows:
        return []
    rows = pool_runs(rows)  # a sweep's repeats: one point per cell, its error bar the runs' range
    builder = FIGURE_BUILDERS.get(suite, generic_figures)
    figs = builder(rows, model) if suite in ("ddp", "allreduce") else builder(rows)
    return [json.loads(f.to_json()) for f in figs]


VERDICT_COLORS = {"slower": "#d62728", "faster": "#2ca02c", "same": "#7f7f7f", "inconclusive": "#ff9f1c"}


def compare_figure(result: dict[str, Any]) -> dict[str, Any] | None:
    """B / A per matching cell with its 95 % interval, coloured by verdict, the threshold band drawn."""
    cells = [c for c in result["cells"] if c["ratio"] is not None]
    if not cells:
        return None
    var = varying([c["params"] for c in result["cells"]], result["cells"][0]["params"].keys())
    labels = [_label(c["params"], var) or "cell" for c in cells]
    has_ci = [c["ci_low"] is not None for c in cells]
    fig = go.Figure(go.Scatter(
        x=labels, y=[c["ratio"] for c in cells], mode="markers",
        marker={"size": 10, "color": [VERDICT_COLORS[c["verdict"]] for c in cells]},
        error_y={"type": "data", "symmetric": False,
                 "array": [c["ci_high"] - c["ratio"] if ok else 0 for c, ok in zip(cells, has_ci, strict=True)],
                 "arrayminus": [c["ratio"] - c["ci_low"] if ok else 0 for c, ok in zip(cells, has_ci, strict=True)]},
        text=[c["verdict"] for c in cells], hovertemplate="%{x}<br>B / A %{y:.3f}<br>%{text}<extra></extra>"))
    t = result["threshold"]
    fig.add_hrect(y0=1 - t, y1=1 + t, fillcolor="#7f7f7f", opacity=0.12, line_width=0)
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title=f"B / A median time per cell, 95 % interval (band: +/-{t:.0%}; below 1: B is faster)",
                      yaxis_title="ratio")
    return json.loads(fig.to_json())


def history_figure(result: dict[str, Any]) -> dict[str, Any] | None:
    """Median per sweep with its 95 % interval as a band, one line per cell; regressions as red X."""
    series = [s for s in result["series"] if s["points"]]
    if not series:
        return None
    params = [s["params"] for s in series]
    keys = [k for k in sorted({k for p in params for k in p})
            if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1]
    fig = go.Figure()
    for i, s in enumerate(series):
        pts, color = s["points"], PALETTE[i % len(PALETTE)]
        x = [f"#{p['sweep_id']}" + (f" {p['commit'][:8]}" if p["commit"] else "") for p in pts]
        name = _label(s["params"], keys) if keys else "cell"
        fig.add_trace(go.Scatter(x=x + x[::-1], y=[p["ci_high"] for p in pts] + [p["ci_low"] for p in pts][::-1],
                                 fill="toself", fillcolor=color, opacity=0.15, line=dict(width=0),
                                 hoverinfo="skip", showlegend=False, legendgroup=name))
        fig.add_trace(go.Scatter(x=x, y=[p["median_ms"] for p in pts], mode="lines+markers", name=name,
                                 legendgroup=name, line=dict(color=color)))
        bad = [(xi, p) for xi, p in zip(x, pts, strict=True) if p["regression"]]
        if bad:
            fig.add_trace(go.Scatter(
                x=[b[0] for b in bad], y=[b[1]["median_ms"] for b in bad], mode="markers", name=f"{name}: slower",
                legendgroup=name, marker=dict(symbol="x", size=13, color=VERDICT_COLORS["slower"]),
                hovertext=[f"{b[1]['ratio']:.3f}x the sweep before" for b in bad], hoverinfo="text+x"))
    fig.update_layout(title=f"{result['suite']}: median per sweep, 95 % interval (slower than the sweep before: x, "
                            f"threshold {result['threshold']:.0%})", yaxis_title="ms", xaxis_title="sweep (commit)",
                      height=460)
    return json.loads(fig.to_json())


def planner_figure(result: dict[str, Any]) -> dict[str, Any]:
    """Per strategy (and the best FSDP+TP split): compute and communication time per device, memory."""
    rows = list(result["strategies"]) + ([result["best_split"]] if result.get("best_split") else [])
    labels = [r["strategy"] + (f" ({r['n_fsdp']}x{r['n_tp']})" if r["strategy"] == "fsdp_tp" else "") for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step per device (ms)", "memory per device (GB)"))
    fig.add_trace(go.Bar(x=labels, y=[r["compute_s"] * 1e3 for r in rows], name="compute"), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[r["comm_s"] * 1e3 for r in rows], name="communication"), row=1, col=1)
    for part in ("params", "grads", "optimizer_state", "activations"):
        fig.add_trace(go.Bar(x=labels, y=[r["memory"][part] / 1e9 for r in rows], name=part), row=1, col=2)
    fig.add_hline(y=result["cluster"]["memory_bytes"] / 1e9, line=dict(dash="dash", color="#d62728"),
                  annotation_text="device memory", row=1, col=2)
    fig.update_layout(barmode="group", height=420, title=f"{result['cluster']['devices']} devices")
    fig.update_layout(barmode="relative")  # memory parts stack; the time bars sit side by side below
    fig.update_traces(offsetgroup="time", selector=dict(name="compute"))
    fig.update_traces(offsetgroup="comm", selector=dict(name="communication"))
    return json.loads(fig.to_json())
