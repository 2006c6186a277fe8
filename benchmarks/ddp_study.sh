#!/usr/bin/env bash
# The data-parallel studies on a host with 2 GPUs, through `benchlab run --preset` (the same sweeps the
# form's Studies box creates): the CS336 DDP study (xl) and the bucket sweep on the 1.3B model, each
# after the all-reduce sweep its bucket model is fitted on. Import the files (in order) to see the charts.
# Usage: benchmarks/ddp_study.sh OUT_DIR [PYTHON [PRESET ...]]   (from the repository root; pass BENCHLAB_COMMIT)
# Each preset is one `benchlab run`; name one per call where a call has a time limit (on two H200s the
# course study's 8 xl cells and its all-reduce sweep took longer than 330 s).
set -u
out=${1:?output folder}; py=${2:-$(command -v python3)}
presets=("${@:3}"); [ ${#presets[@]} -gt 0 ] || presets=(ddp-course ddp-buckets-1.3b)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
for preset in "${presets[@]}"; do
  "$py" -m backend.cli run --preset "$preset" --out "$out/$preset" --timeout-s 900 > "$out/$preset.log" 2>&1
  echo "$preset rc=$?"; tail -n 25 "$out/$preset.log"
done
