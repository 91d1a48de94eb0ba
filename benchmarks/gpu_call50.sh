# Session 20, call 6: the dispatched one-row tile with K not a whole number of tiles and
# fractional zero points (not folded), on the GPU.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "one_row_dispatch or staged" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
