# session 11, device call 3: split K summed in the kernel only where it won (N <= 8,192 at
# 1-2 rows; always at 3-64 rows), no integer-zeros fold; then the full end-to-end run (#7)
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_splitk_gpu.py > $OUT/tests.log 2>&1); tail -2 $OUT/tests.log
timeout 80 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -5
timeout 430 python3 benchmarks/e2e.py --quick --budget-s 250 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | tail -40
