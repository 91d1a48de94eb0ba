# Session 30 (written after the device time ran out; NOT run; after gpu_call100.sh). ~5 min.
# The prefix scenario (cached 1,000-token prompt + 24 new tokens; session 27: TTFT 7.1 ms on,
# 5.8x) with prefill attention's split keys off / on / off / on (EDGE_LLM_PREFILL_SPLIT), then
# decode at batch 1 / 2 / 4 with session 30's two flipped defaults off (EDGE_LLM_GEMV_SILU=0
# EDGE_LLM_DECODE_PREFETCH=0) / on / off / on: were the two single gains (1.008x, 1.007x at
# batch 1) additive?
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
for run in off1 on1 off2 on2; do
  v=1; [[ $run == off* ]] && v=0
  (cd /tmp && EDGE_LLM_PREFILL_SPLIT=$v timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios prefix --out $OUT/p$run > $OUT/p$run.log 2>&1)
  echo "split $run $(grep -E 'INFO e2e: prefix' $OUT/p$run.log | sed 's/^.*INFO e2e: //' | cut -c1-120)"
done
for run in off1 on1 off2 on2; do
  vars=(); [[ $run == off* ]] && vars=(EDGE_LLM_GEMV_SILU=0 EDGE_LLM_DECODE_PREFETCH=0)
  (cd /tmp && env "${vars[@]}" timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 1,2,4 --out $OUT/d$run > $OUT/d$run.log 2>&1)
  echo "defaults $run $(grep -E 'decode b' $OUT/d$run.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/' | tr '\n' ' ')"
done
find $OUT -name '*.png' -delete
