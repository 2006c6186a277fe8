#!/usr/bin/env bash
# The GPU checks of a change, on a host with torch in its own environment and no network: install
# benchlab from a wheelhouse, then run the stages named (all four when none is):
#   kernels      the kernels' GPU tests (`-m gpu`): every shape class, ragged tiles row by row, plan
#                replay, CUDA graphs, inductor; about 4 minutes on an H200 with cold caches
#   kernels-cuda the kernel tests written for the CPU, run on CUDA (a GPU host does not turn the
#                interpreter on, so they meet TF32 and real launches); about 4 minutes cold
#   suites       the suites' GPU tests, then the distributed suites through `benchlab run` on one GPU:
#                one-rank ddp and allreduce cells, which exercise the CUDA-event timing and the
#                profiler's kernel accounting
#   leaderboard  the leaderboard step at a quarter of its layers and context (FSDP and ZeRO-1, one rank)
#   host         (named only) the flash kernel's launch path piece by piece (flash_host_time --parts)
#                and its host time in turns with SDPA on six shapes; about 4 minutes
#   small-grid   (named only) the small grid's seq 128 and 1024 cells, where the host sets the pace,
#                in three rounds (`--repeats 3`): flash_triton against SDPA flash and cuDNN (impl the
#                last axis, so a shape's implementations run back to back), each cell the median of its
#                runs (summarize_attention); about 3 minutes on an H100
#   small-turns  (named only) benchmarks/specs/attention_small_turns.yaml: flash_triton timed in turns
#                with SDPA flash and with cuDNN, sample by sample, on the small shapes up to seq 4096,
#                the speed-up over each with its interval (summarize_attention)
#   main-turns   (named only) benchmarks/specs/attention_vs_sdpa_turns.yaml: the same in turns on the 16k-token
#                grid and the leaderboard shape, forward+backward; about 5 minutes cold on an H100
#   passes-turns (named only) benchmarks/specs/attention_passes_turns.yaml: forward and backward apart, in turns
#                with cuDNN, at seq >= 4096 and on the leaderboard shape
#   timing       (named only) the harness on CUDA: every GPU test of tests/worker, then cells timed back to back
#                through worker.harness.measure (attention without `against`, the model suite's training step)
#   suite-sustained (named only) benchmarks/specs/attention_sustained.yaml: the attention suite's sustained timing
#                (sustain_ms 1000, three rounds): flash_triton and cuDNN each alone, as do_bench times them, at
#                seq >= 2048 and on the leaderboard shape; about 5 minutes on an H100
#   passes-sustained (named only) benchmarks/specs/attention_passes_sustained.yaml: the same timing with the
#                forward and the backward apart, on the leaderboard shape and at seq 4096 (d 64 and 128)
#   sustained    (named only) the 16k-token grid's shapes of seq >= 2048 and the leaderboard shape under do_bench
#                (rep 100 ms, its default), flash_triton in turns with SDPA flash and cuDNN, three rounds
#                (benchmarks.flash_sustained); sustained-long the same at rep 1000 ms, where the chip reaches its
#                power limit as under the course's rep 10000
#   course       (named only) the leaderboard test's step as the course times it (torch.compile'd apply,
#                do_bench), two rounds in turns with cuDNN and SDPA flash (flash_host_time --leaderboard-only)
#   autotune-heat (named only) BENCHLAB_AUTOTUNE_HEAT_MS 0 against 300: six processes, alternating, each
#                autotuning the d=128 forward afresh and timing it under sustained load beside a fixed tile
#                (flash_ab --pin fwd=256,64,8,3); prints each process's picks and its autotuned/fixed ratio
# Each stage fits a 10-minute call. The two-GPU studies are benchmarks/ddp_study.sh and
# benchmarks/specs/leaderboard.yaml.
# Usage: benchmarks/gpu_checks.sh OUT_DIR WHEELHOUSE [PYTHON] [STAGE...]     (from the repository root)
# Pass BENCHLAB_COMMIT: a copied tree may carry a stale .git, and the commit recorded must be what ran.
set -u
out=${1:?output folder}; wh=${2:?wheelhouse}; py=${3:-$(command -v python3)}
shift $(( $# < 3 ? $# : 3 ))
stages=${*:-kernels kernels-cuda suites leaderboard}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PIP_NO_INDEX=1 PIP_FIND_LINKS="$wh" make install PYTHON="$py" EXTRAS= > "$out/install.log" 2>&1 || { tail "$out/install.log"; exit 1; }
"$py" -m pip install -q --no-index --find-links "$wh" pytest >> "$out/install.log" 2>&1
attention_spec() {  # NAME SPEC: run an attention spec into $out/NAME.jsonl, then its summary
  timeout 560 "$py" -m backend.cli run --spec "$2" --out "$out/$1.jsonl" > "$out/$1.log" 2>&1
  echo "$1 rc=$?"
  "$py" -m benchmarks.summarize_attention "$out/$1.jsonl" > "$out/$1.md" 2>&1; tail -n 32 "$out/$1.md"
}
sustained_grid() {  # NAME REP_MS: the grid under do_bench in turns into $out/NAME.json, its table in NAME.md
  timeout 560 "$py" -m benchmarks.flash_sustained --rep-ms "$2" --rounds 3 --out "$out/$1.json" --summary "$out/$1.md" \
    --commit "${BENCHLAB_COMMIT:-}" > "$out/$1.log" 2>&1
  echo "$1 rc=$?"; cat "$out/$1.md" 2>/dev/null || tail -n 5 "$out/$1.log"
}
for stage in $stages; do
  case $stage in
    kernels)
      timeout 540 "$py" -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests/kernels > "$out/gpu_tests_kernels.log" 2>&1
      echo "kernel gpu tests rc=$?"; tail -n 3 "$out/gpu_tests_kernels.log" ;;
    kernels-cuda)
      timeout 540 "$py" -m pytest -q -m "not gpu" -p no:cacheprovider --durations=10 tests/kernels \
        > "$out/gpu_tests_kernels_cuda.log" 2>&1
      echo "kernel tests on cuda rc=$?"; tail -n 3 "$out/gpu_tests_kernels_cuda.log" ;;
    suites)
      timeout 120 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/worker/test_suites.py > "$out/gpu_tests_suites.log" 2>&1
      echo "suite gpu tests rc=$?"; tail -n 3 "$out/gpu_tests_suites.log"
      timeout 200 "$py" -m backend.cli run ddp --out "$out/ddp_1gpu.jsonl" --timeout-s 180 -p device=cuda -p world_size=1 \
        -p size=small -p precision=bf16 -p wrapper=none,bucketed,zero1,fsdp,torch_ddp > "$out/ddp_1gpu.log" 2>&1
      echo "ddp rc=$?"; tail -n 8 "$out/ddp_1gpu.log"
      timeout 100 "$py" -m backend.cli run allreduce --out "$out/allreduce_1gpu.jsonl" -p device=cuda -p world_size=1 \
        -p size_mb=1,16,256 > "$out/allreduce_1gpu.log" 2>&1
      echo "allreduce rc=$?"; tail -n 5 "$out/allreduce_1gpu.log" ;;
    leaderboard)
      timeout 400 "$py" -m backend.cli run leaderboard --out "$out/leaderboard_1gpu.jsonl" --timeout-s 190 -p device=cuda \
        -p world_size=1 -p scale=0.25 -p sharding=fsdp,zero1 -p steps=3 > "$out/leaderboard_1gpu.log" 2>&1
      echo "leaderboard rc=$?"; tail -n 6 "$out/leaderboard_1gpu.log" ;;
    host)
      timeout 280 "$py" -m benchmarks.flash_host_time --parts --rounds 5 --out "$out/flash_host_parts.json" \
        --commit "${BENCHLAB_COMMIT:-}" > "$out/flash_host_parts.log" 2>&1
      echo "host parts rc=$?"; tail -n 2 "$out/flash_host_parts.log" | cut -c1-400
      timeout 300 "$py" -m benchmarks.flash_host_time --rounds 2 --out "$out/flash_host_time.json" \
        --commit "${BENCHLAB_COMMIT:-}" > "$out/flash_host_time.log" 2>&1
      echo "host time rc=$?"; tail -n 6 "$out/flash_host_time.log" | cut -c1-400 ;;
    small-grid)
      timeout 560 "$py" -m backend.cli run attention --out "$out/attention_small_hostbound.jsonl" --repeats 3 \
        -p batch=1,8 -p heads=16,32 -p seq_len=128,1024 -p d_head=64,128 -p causal=true,false -p dtype=bf16 \
        -p pass=fwd_bwd -p device=cuda -p warmup=5 -p repeats=30 -p impl=flash_triton,sdpa_flash,sdpa_cudnn > "$out/attention_small_hostbound.log" 2>&1
      echo "small grid rc=$?"
      "$py" -m benchmarks.summarize_attention "$out/attention_small_hostbound.jsonl" \
        > "$out/attention_small_hostbound.md" 2>&1; tail -n 20 "$out/attention_small_hostbound.md" ;;
    small-turns) attention_spec attention_small_turns benchmarks/specs/attention_small_turns.yaml ;;
    main-turns) attention_spec attention_main_turns benchmarks/specs/attention_vs_sdpa_turns.yaml ;;
    passes-turns) attention_spec attention_passes_turns benchmarks/specs/attention_passes_turns.yaml ;;
    passes-sustained) attention_spec attention_passes_sustained benchmarks/specs/attention_passes_sustained.yaml ;;
    timing)
      timeout 150 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/worker > "$out/gpu_tests_worker.log" 2>&1
      echo "worker gpu tests rc=$?"; tail -n 3 "$out/gpu_tests_worker.log"
      timeout 150 "$py" -m backend.cli run attention --out "$out/attention_measure.jsonl" -p batch=4 -p heads=16 \
        -p seq_len=1024,4096 -p d_head=64 -p causal=true -p dtype=bf16 -p pass=fwd_bwd -p device=cuda \
        -p impl=flash_triton,sdpa_flash > "$out/attention_measure.log" 2>&1
      echo "attention rc=$?"; tail -n 9 "$out/attention_measure.log"
      timeout 200 "$py" -m backend.cli run model --out "$out/model_measure.jsonl" -p size=small -p precision=bf16 \
        -p device=cuda -p attention=flash_triton,sdpa -p optimizer=torch_fused > "$out/model_measure.log" 2>&1
      echo "model rc=$?"; tail -n 7 "$out/model_measure.log" ;;
    suite-sustained) attention_spec attention_suite_sustained benchmarks/specs/attention_sustained.yaml ;;
    sustained) sustained_grid attention_sustained_rep100 100 ;;
    sustained-long) sustained_grid attention_sustained_rep1000 1000 ;;
    course)
      timeout 300 "$py" -m benchmarks.flash_host_time --leaderboard-only --rounds 2 --leaderboard-rep-ms 1000 \
        --out "$out/lb_course.json" --commit "${BENCHLAB_COMMIT:-}" > "$out/lb_course.log" 2>&1
      echo "leaderboard as the course times it rc=$?"; tail -n 8 "$out/lb_course.log" | cut -c1-400 ;;
    autotune-heat)
      for i in 1 2 3; do for heat in 0 300; do
        BENCHLAB_AUTOTUNE_HEAT_MS=$heat timeout 85 "$py" -m benchmarks.flash_ab --pass fwd --sustain-ms 400 --rounds 3 \
          --pin fwd=256,64,8,3 --shape 4,16,4096,128 --shape 1,16,16384,128 --shape 4,16,4096,128,causal \
          --out "$out/autotune_heat_${heat}_$i.json" --commit "${BENCHLAB_COMMIT:-}" > "$out/autotune_heat_${heat}_$i.log" 2>&1
        echo "autotune heat $heat run $i rc=$?"
        "$py" -c 'import json, sys; r = json.load(open(sys.argv[1]))
picks = r.get("autotuned", {}).get("baseline", {}).get("fwd", {})
for c in r["cells"]:
    key = (c["shape"][-1], c["causal"], c["shape"][2])
    pick = [v for k, v in picks.items() if k.startswith("(%d, %s, %d," % key)]
    print(c["shape"], c["causal"], "autotuned/fixed speed", round(1 / c["speedup"], 3), pick)' "$out/autotune_heat_${heat}_$i.json"
      done; done ;;
    *) echo "unknown stage $stage (kernels, kernels-cuda, suites, leaderboard, host, small-grid, small-turns, main-turns, passes-turns, timing, suite-sustained, sustained, sustained-long, course, autotune-heat)"; exit 2 ;;
  esac
done
