"""BucketedDDP against torch DistributedDataParallel, same bucket sizes, steps interleaved in one run.

    python -m benchmarks.ddp_vs_torch --out docs/results/cpu/ddp_vs_torch_interleaved.jsonl
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def interleaved_rank(rank: int, world: int, cfg: dict) -> dict:
    """BucketedDDP and torch's DistributedDataParallel with the same bucket size, stepped alternately in
    one process (A, B, A, B, ...) so both see the same machine state; each step bracketed by CUDA events."""
    import time

    import torch
    import torch.distributed as dist

    from worker.suites.ddp_rank import make_variants

    on_gpu = cfg["device"] == "cuda"
    device = f"cuda:{rank}" if on_gpu else "cpu"
    if not on_gpu and cfg.get("threads_per_rank"):
        torch.set_num_threads(cfg["threads_per_rank"])
    g = torch.Generator().manual_seed(1000 + rank)
    tokens = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["context_length"]), generator=g).to(device)
    host_group = dist.new_group(backend="gloo")
    contenders = {name: (make_variants({**cfg, "wrapper": name}, device)[0], []) for name in ("bucketed", "torch_ddp")}
    for i in range(cfg["warmup"] + cfg["steps"]):
        for variant, times in contenders.values():
            if on_gpu:
                torch.cuda.synchronize()
            dist.barrier(group=host_group)
            t0 = time.perf_counter()
            if on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            variant.step(tokens, tokens)
            if on_gpu:
                end.record()
                end.synchronize()
            ms = start.elapsed_time(end) if on_gpu else (time.perf_counter() - t0) * 1e3
            if i >= cfg["warmup"]:
                times.append(ms)
    return {"rank": rank, **{name: times for name, (_, times) in contenders.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--buckets", default="1,10,25,100")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args(argv)

    from parallel.launch import launch
    from worker.harness import Timing, fingerprint

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write(json.dumps({"kind": "env", **fingerprint()}) + "\n")
        for mb in (float(x) for x in args.buckets.split(",")):
            cfg = {"device": args.device, "threads_per_rank": 1, "vocab_size": 10_000, "context_length": 64,
                   "batch": 1, "d_model": args.d_model, "num_layers": args.layers, "num_heads": 12,
                   "d_ff": 4 * args.d_model, "bucket_size_mb": mb, "warmup": args.warmup, "steps": args.steps,
                   "optimizer": "adamw", "attention": "sdpa", "precision": "fp32"}
            res = launch(interleaved_rank, args.world_size, args=(cfg,), device=args.device, timeout_s=3600)
            ours, theirs = Timing.from_samples(res[0]["bucketed"]), Timing.from_samples(res[0]["torch_ddp"])
            row = {"kind": "pair", "bucket_size_mb": mb, "config": cfg, "bucketed": ours.as_dict(),
                   "torch_ddp": theirs.as_dict(), "ratio_bucketed_over_torch": ours.median_ms / theirs.median_ms,
                   "rank_samples_ms": res}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"bucket {mb:g} MB: bucketed {ours.median_ms:.1f} ms, torch DDP {theirs.median_ms:.1f} ms, "
                  f"ratio {row['ratio_bucketed_over_torch']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
