# Session 14, call 3 (the last): end to end with this session's kept changes (rotary + K/V
# write in one launch, per-sequence decode partitions, unrolled in-kernel split sums up to
# 16); then the GPU tests of the decode kernel and the graphs.
set -u
source benchmarks/gpu_setup.sh
timeout 170 python3 benchmarks/e2e.py --quick --scenarios decode,offline,baseline --budget-s 140 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A14 "headline"
(cd /tmp/checks && timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
