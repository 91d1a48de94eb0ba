# Session 20, call 5: the other GPU test modules on the final code (engines with fused
# layers, prefill graphs, warm-up, fp8 and fp16 KV caches, sampler, fused kernels, the planes
# and swap kernels): they run the new one-row dispatch through whole engines.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 480 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py tests/test_kv_fp8_gpu.py tests/test_kv_cache_gpu.py tests/test_sampler_gpu.py tests/test_kernels_fused_gpu.py tests/test_w4a16_planes_gpu.py tests/test_w4a16_swap_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
