# Session 22, call 4: GPU tests of the 17-64 row mma.sync dispatch: the kernel modules (the
# DISABLE_MMA_V3 subprocess test included), then whole engines under DISABLE_MMA_V3=1.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_w4a16_swap_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
(cd /tmp/checks && DISABLE_MMA_V3=1 timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests_mma_sync.log 2>&1); tail -1 $OUT/tests_mma_sync.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests_mma_sync.log | head -12
