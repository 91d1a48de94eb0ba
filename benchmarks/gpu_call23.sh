# Session 14, call 3 (the last; little device time left): the GPU tests of the decode kernel
# as it now stands (unrolled in-kernel split sums up to 16), then end-to-end decode with this
# session's kept changes (rotary + K/V write in one launch, per-sequence decode partitions).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py > $OUT/tests.log 2>&1)
timeout 140 python3 benchmarks/e2e.py --quick --scenarios decode --budget-s 120 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A10 "headline"
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
