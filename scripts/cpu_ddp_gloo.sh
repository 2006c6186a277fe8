#!/usr/bin/env bash
# DDP variants on this CPU machine: gloo, 2 ranks, a 91M-parameter Transformer LM, side by side in one run.
set -u
out=${1:-docs/results/cpu}
mkdir -p "$out"
.venv/bin/benchlab run ddp --out "$out/ddp_gloo.jsonl" --timeout-s 1200 \
  -p wrapper=none,naive,flat,overlap,bucketed,torch_ddp -p bucket_size_mb=1,10,25,100 \
  -p world_size=2 -p device=cpu -p threads_per_rank=1 \
  -p d_model=768 -p num_layers=8 -p num_heads=12 -p d_ff=3072 -p vocab_size=10000 -p context_length=64 -p batch=1 \
  -p warmup=1 -p steps=4
