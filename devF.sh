PY=$(ls /opt/torch/.venv/bin/python3 2>/dev/null || command -v python3)
$PY -m pip install -q --no-index --no-deps --target /tmp/wh .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/wh
C=$1; export BENCHLAB_COMMIT=$C
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv > $OUT/gpu_start.txt
timeout 90 $PY -m benchmarks.flash_ab --pass fwd --options gluon_fwd=true --baseline-options gluon_fwd=false --label triton_fwd \
  --variant copy:gluon_fwd=false --sdpa cudnn --sustain-ms 500 --rounds 3 \
  --shape 4,32,4096,64,causal --shape 4,32,4096,64 --commit $C --out $OUT/passes_fwd_d64_4096_$C.json > $OUT/passes_fwd_d64_4096_$C.log 2>&1
tail -2 $OUT/passes_fwd_d64_4096_$C.log | cut -c1-250
timeout 260 $PY -m benchmarks.flash_sustained --rep-ms 1000 --rounds 3 --min-seq 4096 --summary $OUT/attention_sustained_rep1000_h100_$C.md --out $OUT/attention_sustained_rep1000_h100_$C.json > $OUT/attention_sustained_$C.log 2>&1
cut -d'|' -f2,3,7 $OUT/attention_sustained_rep1000_h100_$C.md
