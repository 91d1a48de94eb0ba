# Session 25, after the allocator change (engine/kv_cache.use_expandable_segments, on by
# default) and capture_or_release. Two parts:
# `bash benchmarks/gpu_call83.sh`: the engine-level GPU tests (graphs, the plan's memory test
# with its new expandable-segments check, warm-up, KV caches, fused, sampler, staged reads),
# then serving_memory.py at 0.18 of the H200 with the engine's own default (no env var).
# `bash benchmarks/gpu_call83.sh e2e`: decode, offline (floor fraction), the 24 GB card and
# the HTTP serving scenario (edge-llm serve subprocess, concurrency 1 / 8 / 32 / 64).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
if [[ ${1:-tests} == e2e ]]; then
  (cd /tmp && timeout 560 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,card24,serving --out $OUT/e2e > $OUT/e2e.log 2>&1)
  grep -E "INFO e2e: (decode|offline|24 GB|serv|c=|level|llama2-7b / load)|expandable|Loaded" $OUT/e2e.log | cut -c1-220
  sed -n '/headline/,$p' $OUT/e2e.log | head -30
  exit 0
fi
(cd /tmp/checks && timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py tests/test_kv_cache_gpu.py tests/test_kv_fp8_gpu.py tests/test_fuse_gpu.py tests/test_sampler_gpu.py tests/test_staged_read_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
build_checkpoints $OUT/build.log awq
(cd /tmp && timeout 120 python3 $OLDPWD/benchmarks/serving_memory.py --ckpt /tmp/ck-awq --util 0.18 --out $OUT/sm > $OUT/sm.log 2>&1; grep -v "Loading" $OUT/sm.log | grep -v "INFO" | tail -12; grep -E "expandable|KV cache:" $OUT/sm.log | cut -c1-160)
