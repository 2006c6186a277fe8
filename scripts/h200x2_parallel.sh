#!/usr/bin/env bash
# NCCL runs on two H200s (recorded under docs/results/h200x2/): DDP variants, ZeRO-1, FSDP, all-reduce,
# then the activation-checkpointing memory curve of the xl model on GPU 0.
# Usage: scripts/h200x2_parallel.sh OUT_DIR [SECTION...]   (sections: ddp buckets allreduce ckpt; default all)
set -u
out=${1:?output folder}
shift
sections=${*:-ddp buckets allreduce ckpt}
mkdir -p "$out"
bl() { local suite=$1 name=$2; shift 2; python3 -m backend.cli run "$suite" --out "$out/$name.jsonl" --timeout-s 300 \
  -p device=cuda "$@" > "$out/$name.log" 2>&1; tail -n 20 "$out/$name.log"; }
M="-p d_model=1024 -p num_layers=12 -p num_heads=16 -p d_ff=4096 -p context_length=512 -p batch=4 -p warmup=2 -p steps=5"
for section in $sections; do case $section in
ddp) bl ddp ddp_nccl -p wrapper=naive,flat,overlap,bucketed,torch_ddp,zero1,fsdp -p world_size=2 $M ;;
buckets) bl ddp ddp_buckets_nccl -p wrapper=bucketed -p bucket_size_mb=1,10,100 -p world_size=2 $M ;;
allreduce) bl allreduce allreduce_nccl -p size_mb=1,16,128,1024 -p world_size=2 -p warmup=5 -p repeats=20 ;;
ckpt) bl model model_ckpt -p size=xl -p precision=bf16 -p attention=flash_triton -p context_length=1024,2048 \
  -p checkpointing=none,block,nested -p scope=fwd_bwd -p memory_detail=true -p warmup=1 -p steps=3 ;;
*) echo "unknown section $section" >&2; exit 2 ;;
esac; done
