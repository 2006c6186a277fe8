#!/usr/bin/env bash
# DDP variants on this CPU machine: gloo, 2 ranks, a 91M-parameter Transformer LM (d 768, 8 layers).
set -u
out=${1:-docs/results/cpu}
mkdir -p "$out"
M="-p world_size=2 -p device=cpu -p threads_per_rank=1 -p d_model=768 -p num_layers=8 -p num_heads=12 -p d_ff=3072
   -p vocab_size=10000 -p context_length=64 -p batch=1 -p warmup=1 -p steps=4"
# BucketedDDP vs torch DDP, steps interleaved in one process per bucket size (the fair comparison)
.venv/bin/python -m benchmarks.ddp_vs_torch --steps 12 --out "$out/ddp_vs_torch_interleaved.jsonl"
# every variant as a suite cell: step, comm, wait, overhead over the no-communication step
.venv/bin/benchlab run ddp --out "$out/ddp_gloo_variants.jsonl" --timeout-s 1200 -p wrapper=naive,flat,overlap,zero1,fsdp $M
.venv/bin/benchlab run ddp --out "$out/ddp_gloo_buckets.jsonl" --timeout-s 1200 -p wrapper=bucketed,torch_ddp -p bucket_size_mb=1,10,25,100 $M
