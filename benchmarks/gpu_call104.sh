# Session 31: does prefill attention's key split cost short fresh prompts their first token?
# In the prefill graphs the split is planned for max_model_len (4,096 here), not for the
# step's own context, so a fresh 8-64-token prompt (a few keys) replays split launches: the
# programs past its keys exit at once, but every layer still writes fp32 partials and runs
# the merge launch. benchmarks/ttft.py (fresh random prompts, prefix caching off; the
# "graphs" column replays the prefill graphs) with EDGE_LLM_PREFILL_SPLIT 0 / 1 / 0 / 1.
# If "1" is slower at 8-64 tokens, the graphs need the split decided per step. ~4 min.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
build_checkpoints $OUT/build.log awq
for run in off1 on1 off2 on2; do
  v=1; [[ $run == off* ]] && v=0
  (cd /tmp && EDGE_LLM_PREFILL_SPLIT=$v timeout 110 python3 $OLDPWD/benchmarks/ttft.py --ckpt /tmp/ck-awq --lengths 8,16,32,64,128 --trials 7 --out $OUT/ttft_$run.json > $OUT/ttft_$run.log 2>&1)
  echo "split $run"; grep -E "^ +[0-9]+ \||Error|error" $OUT/ttft_$run.log | cut -c1-120
done
