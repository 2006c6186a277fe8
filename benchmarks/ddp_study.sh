#!/usr/bin/env bash
# The data-parallel studies on a host with 2 GPUs, through `benchlab run --preset` (the same sweeps the
# form's Studies box creates): the CS336 DDP study (xl) and the bucket sweep on the 1.3B model, each
# after the all-reduce sweep its bucket model is fitted on. Import the files (in order) to see the charts.
# Usage: benchmarks/ddp_study.sh OUT_DIR [PYTHON]      (from the repository root; pass BENCHLAB_COMMIT)
set -u
out=${1:?output folder}; py=${2:-$(command -v python3)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
for preset in ddp-course ddp-buckets-1.3b; do
  "$py" -m backend.cli run --preset "$preset" --out "$out/$preset" --timeout-s 900 > "$out/$preset.log" 2>&1
  echo "$preset rc=$?"; tail -n 25 "$out/$preset.log"
done
