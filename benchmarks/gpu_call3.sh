# session 10, device call 3: merged projections on the GPU (tests, decode speed, kernel profile)
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_kernels_fused_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 120 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -5
timeout 150 python3 benchmarks/profile_kernels.py --batches 1,16 --prompt 128 --out $OUT > $OUT/profile.log 2>&1; grep -v Warn $OUT/profile.log | grep -A12 "^batch"
