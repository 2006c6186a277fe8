"""Markdown tables from an attention_vs_sdpa JSONL file: TFLOP/s per impl and flash_triton's ratios.

    python -m worker.benchmarks.summarize_attention docs/results/h200/attention_vs_sdpa.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> tuple[dict, list[dict]]:
    env, rows = {}, []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "env":
            env = r
        elif r.get("kind") == "attn":
            rows.append(r)
    return env, rows


def table(rows: list[dict], dtype: str, pass_: str = "fwd_bwd") -> str:
    shapes = []
    for r in rows:
        key = (tuple(r["shape"]), r["causal"])
        if r["dtype"] == dtype and key not in shapes:
            shapes.append(key)
    impls = [i for i in ("flash_triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive")
             if any(r["impl"] == i and r["dtype"] == dtype for r in rows)]
    head = ["shape (b, h, s, d)", "causal", *[f"{i} TF/s" for i in impls], "triton ms"]
    if "sdpa_flash" in impls:
        head.append("triton / sdpa_flash")
    if "sdpa_cudnn" in impls:
        head.append("triton / cudnn")
    if "sdpa_efficient" in impls and dtype == "fp32":
        head.append("triton / efficient")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, causal in shapes:
        by = {r["impl"]: r for r in rows if tuple(r["shape"]) == shape and r["causal"] == causal and r["dtype"] == dtype}
        tf = {i: by.get(i, {}).get(f"{pass_}_tflops") for i in impls}
        cells = [str(shape), "yes" if causal else "no"]
        cells += [f"{tf[i]:.0f}" if tf[i] else by.get(i, {}).get(f"{pass_}_error", "-")[:20] for i in impls]
        t_ms = by.get("flash_triton", {}).get(f"{pass_}_ms")
        cells.append(f"{t_ms:.3f}" if t_ms else "-")
        for other, cond in (("sdpa_flash", "sdpa_flash" in impls), ("sdpa_cudnn", "sdpa_cudnn" in impls),
                            ("sdpa_efficient", "sdpa_efficient" in impls and dtype == "fp32")):
            if cond:
                cells.append(f"{tf['flash_triton'] / tf[other]:.2f}x" if tf.get("flash_triton") and tf.get(other) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:])[0])
    env, rows = load(path)
    print(f"Source: `{path}`; {env.get('gpu_name')}, torch {env.get('torch')}, triton {env.get('triton')}, "
          f"driver {env.get('driver')}, commit {env.get('git_commit')}. Median of "
          f"{rows[0].get('samples') if rows else '?'} timed runs after warm-up, L2 flushed between runs.\n")
    for dtype in ("bf16", "fp32"):
        for pass_ in ("fwd_bwd", "fwd", "bwd"):
            if any(r["dtype"] == dtype for r in rows):
                print(f"### {dtype}, {pass_.replace('_', '+')}\n")
                print(table(rows, dtype, pass_) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
