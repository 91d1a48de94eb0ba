# Session 30 (written after the device time ran out; NOT run). Prefill attention's split keys
# (kernels/paged_prefill.py, on by default where a launch has fewer programs than the GPU has
# multiprocessors): gpu_call99 timed the kernel (8-64 new tokens over 1,000 / 4,000 keys
# 1.4-1.8x / 2.5-4.2x faster; BENCHMARKS.md, session 30) but its GPU tests ran out of time.
# Here (~8 min): the attention, warm-up and prefill-graph GPU tests (nothing compiles while
# serving: the warm-up now runs two split prefills, with and without PDL), then the kernel
# table with its variants (3 stages, 32-key tiles, 8 warps, power-of-two rows per token).
# Then gpu_call101.sh (the 4090's code path, the prefix scenario) and gpu_call102.sh.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_warmup_gpu.py tests/test_prefill_graphs_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
# the kernel's loop waits ~3 us per 64-key tile (block-table load, then the gather): does a
# third pipeline stage or a 32-key tile hide it? (The PTX at 2 stages keeps the table loads
# as plain ld.global in the loop; at 3 they are cp.async issued ahead. If "3 stages" wins at
# every row, PrefillConfig.num_stages becomes 3 on sm_90: on sm_86 / 89 that variant spills
# 52 bytes per thread at GQA 1, ptxas -v, so it does not carry over to a 3090 / 4090 as is.)
(cd /tmp && timeout 240 python3 $OLDPWD/benchmarks/prefill_split.py --variants > $OUT/prefill_split.log 2>&1; cat $OUT/prefill_split.log)
