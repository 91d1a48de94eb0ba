# Session 21, call 9: the mma.sync dispatch as finally chosen (plane dots with x split at
# 3-16 rows, the "dot" kernel at 17-64) in a DISABLE_MMA_V3=1 subprocess, and the plane dots
# at full size, on the GPU.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "mma_sync_dispatch or plane_dots" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
