# session 11, device call 1: staged weight reads (#6) and split K summed inside the W4A16
# kernels (#5, #7): their GPU tests, then the kernel table, decode, the profile and cold start
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_splitk_gpu.py tests/test_staged_read_gpu.py tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1); tail -4 $OUT/tests.log
timeout 110 python3 benchmarks/kernels.py --quick > $OUT/kernels_quick.log 2>&1; grep -i "w4a16\|geomean\|M=" $OUT/kernels_quick.log | tail -30
timeout 90 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -5
timeout 170 python3 benchmarks/cold_start_gpu.py --out $OUT/cold 2>&1 | tail -6
