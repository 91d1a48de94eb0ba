# Session 30 (written after the device time ran out; NOT run; after gpu_call101.sh). ~3 min.
# Decode at batch 1 / 2 / 4 with session 30's two flipped defaults off (EDGE_LLM_GEMV_SILU=0
# EDGE_LLM_DECODE_PREFETCH=0) / on / off / on: were the two single gains (1.008x, 1.007x at
# batch 1, gpu_call94 / 95) additive?
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
for run in off1 on1 off2 on2; do
  vars=(); [[ $run == off* ]] && vars=(EDGE_LLM_GEMV_SILU=0 EDGE_LLM_DECODE_PREFETCH=0)
  (cd /tmp && env "${vars[@]}" timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 1,2,4 --out $OUT/d$run > $OUT/d$run.log 2>&1)
  echo "defaults $run $(grep -E 'decode b' $OUT/d$run.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/' | tr '\n' ' ')"
done
find $OUT -name '*.png' -delete
