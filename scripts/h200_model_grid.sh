#!/usr/bin/env bash
# The model-suite grid recorded under docs/results/h200/ (run on one H200 through `benchlab run`).
# Usage: scripts/h200_model_grid.sh OUT_DIR
set -u
out=${1:?output folder}
mkdir -p "$out"
run() { local name=$1; shift; python3 -m backend.cli run model --out "$out/model_$name.jsonl" --timeout-s 400 \
  -p device=cuda "$@" > "$out/model_$name.log" 2>&1; tail -n 30 "$out/model_$name.log"; }
# per-size step time, fp32 vs bf16 autocast, the course's model as the course runs it (naive attention, its AdamW)
run sizes -p size=small,medium,large,xl -p precision=fp32,bf16 -p scope=step -p warmup=2 -p steps=5
# forward and forward+backward scopes, for the stacked chart
run scopes -p size=small,xl -p precision=fp32,bf16 -p scope=fwd,fwd_bwd -p warmup=2 -p steps=5
# one profiled cell: trace, kernel categories, memory snapshot
run profile -p size=small -p precision=bf16 -p scope=step -p profile=true -p warmup=2 -p steps=3
# activation checkpointing: xl at context 2048
run ckpt -p size=xl -p precision=bf16 -p context_length=2048 -p checkpointing=none,block,nested -p scope=fwd_bwd \
  -p memory_detail=true -p warmup=1 -p steps=3
# torch.compile, as the course measured it, then benchlab's best: flash kernel, compile, fused AdamW
run compile -p size=small,xl -p precision=bf16 -p compile=true -p scope=step -p warmup=3 -p steps=5
run best -p size=xl -p precision=bf16 -p compile=true -p attention=flash_triton,sdpa -p optimizer=torch_fused \
  -p scope=step -p warmup=3 -p steps=5
