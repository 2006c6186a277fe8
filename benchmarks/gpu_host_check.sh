#!/usr/bin/env bash
# A GPU host as a team deploys it: torch in its own environment, no network. Installs benchlab with
# `make install` from a wheelhouse (timed, and the host's torch checked untouched), then runs the GPU
# paths the fault-tolerance work touched: NCCL DDP / ZeRO-1 / FSDP cells on 2 ranks, and a worker
# killed with SIGKILL while a 2-rank NCCL job runs (its runner and ranks must die with it).
# Usage: benchmarks/gpu_host_check.sh OUT_DIR WHEELHOUSE [PYTHON]     (run from the repository root)
# Pass BENCHLAB_COMMIT: a copied tree may carry a stale .git, and the commit recorded must be what ran.
set -u
out=${1:?output folder}; wh=${2:?wheelhouse}; py=${3:-$(command -v python3)}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
probe='import torch, triton, os; print(torch.__version__, torch.version.cuda, triton.__version__, torch.__file__, os.stat(torch.__file__).st_mtime_ns)'
"$py" -c "$probe" > "$out/torch_before.txt"
t0=$("$py" -c 'import time; print(time.time())')
if command -v make >/dev/null; then how=make
  PIP_NO_INDEX=1 PIP_FIND_LINKS="$wh" make install PYTHON="$py" EXTRAS= > "$out/install.log" 2>&1
else how=scripts/install.sh  # what `make install` runs
  env_prefix=$("$py" -c 'import sys; print(sys.prefix)')
  PIP_NO_INDEX=1 PIP_FIND_LINKS="$wh" scripts/install.sh "$py" "$env_prefix" "" > "$out/install.log" 2>&1
fi
rc=$?
t1=$("$py" -c 'import time; print(time.time())')
"$py" -c "$probe" > "$out/torch_after.txt"
"$py" -c "import json; print(json.dumps({'how': '$how', 'rc': $rc, 'seconds': $t1 - $t0, 'torch_untouched': open('$out/torch_before.txt').read() == open('$out/torch_after.txt').read()}))" > "$out/setup.json"
cat "$out/setup.json"; tail -n 5 "$out/install.log"
[ $rc -eq 0 ] || exit $rc
M="-p d_model=1024 -p num_layers=12 -p num_heads=16 -p d_ff=4096 -p context_length=512 -p batch=4 -p warmup=2 -p steps=5"
timeout 300 "$py" -m backend.cli run ddp --out "$out/ddp_nccl.jsonl" --timeout-s 240 -p device=cuda -p world_size=2 \
  -p wrapper=naive,flat,overlap,bucketed,zero1,fsdp $M > "$out/ddp_nccl.log" 2>&1; echo "ddp rc=$?"; tail -n 14 "$out/ddp_nccl.log"
PYTHONPATH=. timeout 240 "$py" benchmarks/worker_death.py --samples 1 --brokers embedded --lost-after-s 5 \
  --job '{"suite": "ddp", "params": {"world_size": 2, "device": "cuda", "steps": 100000, "warmup": 1}}' \
  --out "$out/worker_death_nccl.json" > "$out/worker_death_nccl.log" 2>&1; echo "death rc=$?"; tail -n 3 "$out/worker_death_nccl.log"
