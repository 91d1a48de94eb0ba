# Session 14, call 3 (the last; little device time left): the GPU tests of the decode kernel
# as it now stands (unrolled in-kernel split sums up to 16 by default) and of the engine with
# CUDA graphs (greedy equality against the torch reference).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
