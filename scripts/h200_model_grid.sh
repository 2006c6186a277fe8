#!/usr/bin/env bash
# The model-suite grid recorded under docs/results/h200/ (run on one H200 through `benchlab run`).
# Usage: scripts/h200_model_grid.sh OUT_DIR [SECTION...]   (no section: all of them, in order)
# Sections: eager compile scopes profile ckpt best (compile_large_bf16, compile_xl_fp32: one cell each). Each writes model_<section>.jsonl and .log.
set -u
out=${1:?output folder}
shift
sections=${*:-eager compile scopes profile ckpt best}
mkdir -p "$out"
run() { local name=$1; shift; python3 -m backend.cli run model --out "$out/model_$name.jsonl" --timeout-s 400 \
  -p device=cuda "$@" > "$out/model_$name.log" 2>&1; tail -n 30 "$out/model_$name.log"; }
for section in $sections; do case $section in
# the course's model as the course runs it (naive attention, its AdamW): size x precision, eager
eager) run eager -p size=small,medium,large,xl -p precision=fp32,bf16 -p scope=step -p warmup=2 -p steps=5 ;;
# the same grid under torch.compile (warm-up covers the compile)
compile) run compile -p size=small,medium,large,xl -p precision=fp32,bf16 -p compile=true -p scope=step \
  -p warmup=3 -p steps=5 ;;
# the compile grid one cell at a time, for a lease too short for the whole section
compile_large_bf16) run compile_large_bf16 -p size=large -p precision=bf16 -p compile=true -p scope=step -p warmup=3 -p steps=5 ;;
compile_xl_fp32) run compile_xl_fp32 -p size=xl -p precision=fp32 -p compile=true -p scope=step -p warmup=3 -p steps=5 ;;
# forward and forward+backward scopes, for the stacked chart
scopes) run scopes -p size=small,xl -p precision=fp32,bf16 -p scope=fwd,fwd_bwd -p warmup=2 -p steps=5 ;;
# one profiled cell: trace, kernel categories, memory snapshot
profile) run profile -p size=small -p precision=bf16 -p scope=step -p profile=true -p warmup=2 -p steps=3 ;;
# activation checkpointing: xl, memory against context length per policy (flash attention, so no
# n x n score tensor hides the activations)
ckpt) run ckpt -p size=xl -p precision=bf16 -p attention=flash_triton -p context_length=512,1024,2048 \
  -p checkpointing=none,block,every_2,nested -p scope=fwd_bwd -p memory_detail=true -p warmup=1 -p steps=3 ;;
# benchlab's best: its flash kernel or SDPA, compile, fused AdamW
best) run best -p size=xl -p precision=bf16 -p compile=true -p attention=flash_triton,sdpa -p optimizer=torch_fused \
  -p scope=step -p warmup=3 -p steps=5 ;;
*) echo "unknown section $section" >&2; exit 2 ;;
esac; done
