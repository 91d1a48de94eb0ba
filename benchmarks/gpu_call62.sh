# Written in session 21, NOT run there (device time spent). The GPU test modules that run the
# session's W4A16 dispatch through whole engines and were not re-run after it: the merged
# 7B-shaped layers at 3 sequences (the gate/up plane dots over x in plane order, inside CUDA
# graphs, against the unmerged engine), prefill graphs, warm-up, fp8/fp16 KV, sampler, fused
# kernels, planes kernels; then the same engine tests with DISABLE_MMA_V3=1 (the 4090's
# split plane dots and dot kernel at 3-64 rows, through the engine).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py tests/test_kv_fp8_gpu.py tests/test_kv_cache_gpu.py tests/test_sampler_gpu.py tests/test_kernels_fused_gpu.py tests/test_w4a16_planes_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
(cd /tmp/checks && DISABLE_MMA_V3=1 timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests_mma_sync.log 2>&1); tail -1 $OUT/tests_mma_sync.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests_mma_sync.log | head -12
