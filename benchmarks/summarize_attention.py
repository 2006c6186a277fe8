"""Markdown tables from attention runs: TFLOP/s per impl and flash_triton's ratios.

Reads `benchlab run --out` files of `attention` sweeps (e.g. of the study specs in
benchmarks/specs/), and the per-shape rows the earlier study script wrote (kind "attn", as in
docs/results/h200/attention_main_534a741.jsonl). Several files (one per grid, say) are read as one
table set; each file's fingerprint is listed.

    benchlab run --spec benchmarks/specs/attention_vs_sdpa.yaml --out main.jsonl
    python -m benchmarks.summarize_attention main.jsonl leaderboard.jsonl > summary.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> tuple[dict, list[dict]]:
    """(fingerprint, one row per (impl, shape, causal, dtype) with `<pass>_ms`, `_p20_ms`, `_tflops`)."""
    env, rows = {}, []
    by_shape: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "env":
            env = r
        elif r.get("kind") == "attn":
            rows.append(r)
        elif r.get("kind") == "cell":  # a benchlab run file: one cell is one pass of one shape
            p, m = r["params"], r.get("metrics") or {}
            shape = [p["batch"], p["heads"], p["seq_len"], p["d_head"]]
            key = (p["impl"], tuple(shape), p["causal"], p["dtype"])
            row = by_shape.setdefault(key, {"impl": p["impl"], "shape": shape, "B": shape[0], "H": shape[1],
                                            "S": shape[2], "D": shape[3], "causal": p["causal"],
                                            "dtype": p["dtype"]})
            env = env or r.get("env") or {}
            pass_ = p["pass"]
            if r["state"] == "done":
                row.update({f"{pass_}_ms": m["median_ms"], f"{pass_}_p20_ms": m["p20_ms"],
                            f"{pass_}_p80_ms": m["p80_ms"], f"{pass_}_tflops": m.get("tflops"),
                            "samples": m.get("samples")})
            else:
                row[f"{pass_}_error"] = f"{r['state']}: {(r.get('error') or '').splitlines()[0][:200]}"
    return env, rows + list(by_shape.values())


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
        by = {r["impl"]: r for r in rows
              if tuple(r["shape"]) == shape and r["causal"] == causal and r["dtype"] == dtype}
        tf = {i: by.get(i, {}).get(f"{pass_}_tflops") for i in impls}
        cells = [str(shape), "yes" if causal else "no"]
        cells += [f"{tf[i]:.0f}" if tf[i] else by.get(i, {}).get(f"{pass_}_error", "-")[:20] for i in impls]
        t_ms = by.get("flash_triton", {}).get(f"{pass_}_ms")
        cells.append(f"{t_ms:.3f}" if t_ms else "-")
        for other, cond in (("sdpa_flash", "sdpa_flash" in impls), ("sdpa_cudnn", "sdpa_cudnn" in impls),
                            ("sdpa_efficient", "sdpa_efficient" in impls and dtype == "fp32")):
            if cond:
                ok = tf.get("flash_triton") and tf.get(other)
                cells.append(f"{tf['flash_triton'] / tf[other]:.2f}x" if ok else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(rows: list[dict]) -> list[str]:
    """Issue 3's figures, checked on the rows present: bf16 fwd+bwd vs SDPA flash at seq >= 2048, the
    leaderboard shape, fp32 vs SDPA efficient at seq >= 8192."""
    def by(shape, causal, dtype):
        return {r["impl"]: r for r in rows
                if tuple(r["shape"]) == shape and r["causal"] == causal and r["dtype"] == dtype}

    out = []
    ratios = []
    for r in rows:
        if r["impl"] == "flash_triton" and r["dtype"] == "bf16" and r["S"] >= 2048 and len(r["shape"]) == 4:
            other = by(tuple(r["shape"]), r["causal"], "bf16").get("sdpa_flash", {})
            if r.get("fwd_bwd_tflops") and other.get("fwd_bwd_tflops"):
                ratios.append(r["fwd_bwd_tflops"] / other["fwd_bwd_tflops"])
    if ratios:
        out.append(f"- bf16 fwd+bwd at seq >= 2048 (d 64/128, causal and not, {len(ratios)} shapes): "
                   f"{min(ratios):.2f}x to {max(ratios):.2f}x SDPA flash (goal >= 1.2x: "
                   f"{'met' if min(ratios) >= 1.2 else 'not met'})")
    lb = by((16, 16384, 64), True, "bf16").get("flash_triton", {})
    if lb.get("fwd_bwd_ms"):
        out.append(f"- leaderboard (16, 16384, 64) causal bf16 fwd+bwd: {lb['fwd_bwd_ms']:.3f} ms median "
                   f"(p20 {lb['fwd_bwd_p20_ms']:.3f}; "
                   f"goal <= 5.0 ms: {'met' if lb['fwd_bwd_ms'] <= 5.0 else 'not met'})")
    fp32 = []
    for r in rows:
        if r["impl"] == "flash_triton" and r["dtype"] == "fp32" and r["S"] >= 8192:
            other = by(tuple(r["shape"]), r["causal"], "fp32").get("sdpa_efficient", {})
            if r.get("fwd_bwd_tflops") and other.get("fwd_bwd_tflops"):
                fp32.append(r["fwd_bwd_tflops"] / other["fwd_bwd_tflops"])
    if fp32:
        out.append(f"- fp32 (TF32 dots) fwd+bwd at seq >= 8192 ({len(fp32)} shapes): {min(fp32):.2f}x to "
                   f"{max(fp32):.2f}x SDPA efficient (goal >= 3x: {'met' if min(fp32) >= 3 else 'not met'})")
    return out


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not paths:
        print("usage: python -m benchmarks.summarize_attention FILE.jsonl [FILE.jsonl ...]", file=sys.stderr)
        return 2
    rows = []
    for path in paths:
        env, part = load(path)
        rows += part
        print(f"- `{path}`: {env.get('gpu_name')} (x{env.get('gpu_count')}), torch {env.get('torch')}, "
              f"triton {env.get('triton')}, driver {env.get('driver')}, commit {env.get('git_commit')}; "
              f"median of {part[0].get('samples') if part else '?'} timed runs after warm-up, L2 flushed between runs")
    print()
    checks = goals(rows)
    if checks:
        print("### Goals\n")
        print("\n".join(checks) + "\n")
    for dtype in ("bf16", "fp32"):
        for pass_ in ("fwd_bwd", "fwd", "bwd"):
            if any(r["dtype"] == dtype for r in rows):
                print(f"### {dtype}, {pass_.replace('_', '+')}\n")
                print(table(rows, dtype, pass_) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
