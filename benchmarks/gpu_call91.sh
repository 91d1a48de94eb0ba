# Session 27. Call 2 (gpu_call90.sh) measured PDL on against off at decode batch 1 / 4 / 16:
# 1.06x / 1.02x / 0.94x. Where it turns: batch 1, 2, 4, 8, 12, 16 with PDL off / on / off / on.
# Then session 26's cold-start script (gpu_call88.sh: the start-up profile and the cold start,
# issue #6's regression; prefetch at serve start, cheaper eager forwards).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
for run in off1 on1 off2 on2; do
  v=0; [[ $run == on* ]] && v=1
  (cd /tmp && EDGE_LLM_PDL=$v timeout 120 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 1,2,4,8,12,16 --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/; s/, [0-9]*% of the bandwidth floor/ |/' | tr '\n' ' ')"
done
bash benchmarks/gpu_call88.sh
