# Written in session 26 (no device lent; NOT run there). Short-step graphs now cover steps of
# several sequences, decode rows alongside (engine/prefill_graphs.py): a prompt joining
# running decodes replays a graph instead of an eager forward (~45 ms of Python for the 7B).
# The GPU tests of both graph kinds and the start-up probes, then the serving scenario
# against session 25 call 6 (first token p50 19.3 / 102 / 347 / 589 ms and inter-token p99
# 4.1 / 5.8 / 57.8 / 82.1 ms at concurrency 1 / 8 / 32 / 64) and prefix caching (8.1x).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_prefill_graphs_gpu.py tests/test_cuda_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; grep -E "graphs .* eager|passed|failed|Error" $OUT/tests.log | tail -8)
(cd /tmp && timeout 300 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios prefix,serving --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (prefix|serving|c=)|prefill graphs|graph memory|KV cache:" $OUT/e2e.log | cut -c1-200
sed -n '/headline/,$p' $OUT/e2e.log | head -14
