# Session 31 (written without a device; NOT run). EDGE_LLM_PREFILL_SPLIT_GRAPHS=1 plans
# prefill attention's key split for one sequence in each prefill graph (else the graph's
# K slots count as q tiles and Llama-2's 32 kv heads never split: BENCHMARKS.md, session 31).
# 1. The prefill graphs' GPU tests with it on (graph replays equal eager forwards).
# 2. The benefit: the prefix scenario's cached first token (976 cached + 24 new tokens, the
#    32-token graph: 8 partitions planned) with the flag 0 / 1 / 0 / 1.
# 3. The cost: fresh 8-128-token prompts' first token (benchmarks/ttft.py, nothing cached:
#    only the first partition has keys) with the flag 0 / 1. ~8 min. If 2 gains and 3
#    loses no more than noise, the flag's default becomes 1 (engine/prefill_graphs.py).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && EDGE_LLM_PREFILL_SPLIT_GRAPHS=1 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
for run in off1 on1 off2 on2; do
  v=1; [[ $run == off* ]] && v=0
  (cd /tmp && EDGE_LLM_PREFILL_SPLIT_GRAPHS=$v timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios prefix --out $OUT/p$run > $OUT/p$run.log 2>&1)
  echo "graph split $run $(grep -E 'INFO e2e: prefix' $OUT/p$run.log | sed 's/^.*INFO e2e: //' | cut -c1-120)"
done
build_checkpoints $OUT/build.log awq
for run in off on; do
  v=1; [[ $run == off* ]] && v=0
  (cd /tmp && EDGE_LLM_PREFILL_SPLIT_GRAPHS=$v timeout 100 python3 $OLDPWD/benchmarks/ttft.py --ckpt /tmp/ck-awq --lengths 8,16,32,64,128 --trials 9 --out $OUT/ttft_$run.json > $OUT/ttft_$run.log 2>&1)
  echo "graph split $run"; grep -E "^ +[0-9]+ \||Error|error" $OUT/ttft_$run.log | cut -c1-120
done
find $OUT -name '*.png' -delete
