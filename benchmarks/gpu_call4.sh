# session 10, device call 4: warm-up test, cold start (issue #6) and decode/prefix (issue #7)
# with merged projections, fused kernels and prefill graphs on by default
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_warmup_gpu.py > $OUT/tests.log 2>&1); tail -2 $OUT/tests.log
timeout 170 python3 benchmarks/cold_start_gpu.py --out $OUT/cold 2>&1 | tail -5
timeout 150 python3 benchmarks/e2e.py --quick --scenarios decode,prefix --budget-s 130 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | grep -i "decode\|prefix\|floor" | tail -12
