# session 11, device call 4: the final kernel choice under the GPU tests (warm-up included),
# and the fp16-planes tl.dot variants (kernels/w4a16_planes.py) timed beside the dispatched
# path at 5-1024 rows
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w4a16_planes_gpu.py tests/test_splitk_gpu.py tests/test_staged_read_gpu.py tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1); tail -4 $OUT/tests.log
timeout 240 python3 benchmarks/kernels.py --quick > $OUT/kernels_quick.log 2>&1; grep "M=" $OUT/kernels_quick.log | grep -v "M=    1 \|M=    2 " | cut -c1-175
