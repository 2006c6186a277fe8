#!/usr/bin/env bash
# The flash kernels' GPU tests, the persistent kernels' A/Bs against one program a tile, and the grid against
# cuDNN (docs/results/h100/persistent/README.md), in one command for a short GPU lease, each section cut off so
# the whole run ends within SECONDS.
# Usage: scripts/flash_gpu_checks.sh OUT_DIR SECONDS [SECTION...]   (no section: all of them, in this order)
# Sections:
#   tests     every kernel GPU test (pytest -m gpu tests/kernels/, 8 workers)
#   bwd_p     the fused backward, order ws against ws-p (persistent), each alone 300 ms a round, with cuDNN
#   bwd_p_ab  flash_triton's backward with LaunchOptions(fused_persistent=True) against the default, each
#             alone a second a round (flash_ab), on the d=128 shapes of seq 4096 and 8192
#   fwd64     the causal d=64 forward, ws against ws-p (persistent, tiles from the schedule), the same way, at 32
#             heads and seq 4096-16384 and on the leaderboard's (16, 1, 16384, 64)
#   grid      forward+backward against SDPA's flash and cuDNN under do_bench (seq >= 4096), d=128 then d=64
# PY names the Python (default python3); COMMIT the commit recorded in the JSON (default: git's HEAD).
set -u
out=${1:?output folder}
budget=${2:?seconds for the whole run}
shift 2
sections=${*:-tests bwd_p bwd_p_ab fwd64 grid}
py=${PY:-python3}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
start=$(date +%s)
mkdir -p "$out"
left() { echo $((budget - ($(date +%s) - start))); }
# run NAME CAP CMD...: CMD under the smaller of CAP and what is left, its output in NAME.log; skipped under 30 s
run() { local name=$1 cap=$2; shift 2; local t; t=$(left); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 30 ]; then echo "$name: skipped, $t s left" | tee -a "$out/steps.log"; return; fi
  timeout "$t" "$@" > "$out/$name.log" 2>&1; echo "$name: rc $? after $(($(date +%s) - start)) s" | tee -a "$out/steps.log"; }
for section in $sections; do case $section in
tests) run gpu_tests_kernels 240 "$py" -m pytest -m gpu -n 8 -q -p no:cacheprovider tests/kernels/ ;;
bwd_p) for d in 128 64; do mode=$([ "$d" = 128 ] && echo halves || echo turns)  # how each head dim ships
    shapes=$([ "$d" = 128 ] && echo "4,16,4096,128 4,16,4096,128,causal 2,16,8192,128" || echo "4,32,4096,64")
    run "bwd_persistent_d$d" 150 "$py" -m benchmarks.flash_gluon_bwd_ab --no-hybrid --config 64,64,2,4 \
      --fused-config 64,128,3,4,ws --fused-config 64,128,3,4,ws-p --dq-mode "$mode" \
      $(printf -- '--shape %s ' $shapes) --sdpa cudnn --sustain-ms 300 --rounds 3 \
      --out "$out/bwd_persistent_d${d}_$commit.json" --commit "$commit"; done ;;
bwd_p_ab) run bwd_persistent_ab 150 "$py" -m benchmarks.flash_ab --pass bwd --options fused_persistent=true \
    --shape 4,16,4096,128 --shape 4,16,4096,128,causal --shape 2,16,8192,128 --sdpa cudnn --sustain-ms 1000 \
    --rounds 3 --out "$out/bwd_persistent_ab_$commit.json" --commit "$commit" ;;
fwd64) run fwd64_causal 120 "$py" -m benchmarks.flash_gluon_ab --config 192,128,4,4,ws --config 192,128,4,4,ws-p \
    --shape 4,32,4096,64,causal --shape 2,32,8192,64,causal --shape 1,32,16384,64,causal \
    --shape 16,1,16384,64,causal --sdpa cudnn \
    --sustain-ms 300 --rounds 3 --out "$out/fwd64_causal_$commit.json" --commit "$commit" ;;
grid) for d in 128 64; do run "grid_d$d" 600 "$py" -m benchmarks.flash_sustained --rep-ms 1000 --rounds 3 \
    --min-seq 4096 --head-dim "$d" --out "$out/grid_d${d}_$commit.json" --summary "$out/grid_d${d}_$commit.md" \
    --commit "$commit"; done ;;
*) echo "unknown section $section" >&2; exit 2 ;;
esac; done
