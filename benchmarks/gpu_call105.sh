# Session 31 (written without a device; NOT run). EDGE_LLM_PREFILL_SPLIT_GRAPHS=1 plans
# prefill attention's key split for one sequence in each prefill graph (else the graph's
# K slots count as q tiles and Llama-2's 32 kv heads never split: BENCHMARKS.md, session 31).
# 1. The prefill graphs' GPU tests with it on (graph replays equal eager forwards).
# 2. The benefit: the prefix scenario's cached first token (976 cached + 24 new tokens, the
#    32-token graph: 8 partitions planned) with the flag 0 / 1 / 0 / 1.
# ~7 min. The cost side (fresh prompts, nothing cached) is gpu_call106.sh. If 2 gains and
# gpu_call106 loses no more than noise, the flag's default becomes 1
# (engine/prefill_graphs.py).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && EDGE_LLM_PREFILL_SPLIT_GRAPHS=1 timeout 140 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
prefix_switch EDGE_LLM_PREFILL_SPLIT_GRAPHS
find $OUT -name '*.png' -delete
