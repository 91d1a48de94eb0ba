# Session 18, call 1: the KV plan sets the CUDA graphs' memory aside (one capture stream for
# every graph; the largest decode and prefill graphs captured over a scratch cache before the
# plan). GPU tests of the graph paths, the 24 GB card scenario, and where the pools' memory goes.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|Error" $OUT/tests.log | head -8
timeout 200 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios card24 --out $OUT/e2e > $OUT/e2e.log 2>&1; tail -25 $OUT/e2e.log | grep -E "card|GB|graph|Error|error"
grep -E "CUDA graph|KV cache" $OUT/e2e/*.log 2>/dev/null | tail -6
timeout 150 python3 benchmarks/graph_memory.py --ckpt /tmp/edge-llm-bench/llama2-7b-awq-g128 --out $OUT/gm > $OUT/gm.log 2>&1; cat $OUT/gm.log | grep -v "^\s*$" | tail -30
