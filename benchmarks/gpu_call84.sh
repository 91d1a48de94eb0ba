# Session 25: one-sequence prefill graphs up to 512 tokens (were 8-64), logits of the last
# row only. GPU tests of the graphs, time to first token by prompt length with and without
# the prefill graphs in one engine (benchmarks/ttft.py), then e2e prefix caching, the 24 GB
# card (the plan now sets aside the 512-token graph) and HTTP serving (TTFT at c = 1..64).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs_gpu.py tests/test_cuda_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
build_checkpoints $OUT/build.log awq
(cd /tmp && timeout 120 python3 $OLDPWD/benchmarks/ttft.py --ckpt /tmp/ck-awq --out $OUT/ttft.json > $OUT/ttft.log 2>&1; grep -E "prompt tokens|^ +[0-9]+ \||prefill graphs|Error|error" $OUT/ttft.log | cut -c1-200)
(cd /tmp && timeout 200 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios prefix,card24,serving --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (prefix|24 GB|serv|llama2-7b / load)|prefill graphs|graph memory" $OUT/e2e.log | cut -c1-200
