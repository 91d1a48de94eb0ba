# Session 23, call 2. (1) The one-row GEMV's split K summed in the kernel at every width
# (Llama-2 q/k/v, N 12,288, takes a second launch: 32 reduce launches a batch-1 step), or a
# fixed split (gemv_sweep.py at 1-2 rows). (2) e2e decode, offline and the transformers
# baseline with the new offline floor (KV reads at copy bandwidth + matmul flops at the
# measured 8192^3 fp16 rate).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 150 python3 benchmarks/gemv_sweep.py --ms 1,2 --out $OUT/sweep > $OUT/sweep.log 2>&1
tail -30 $OUT/sweep.log | cut -c1-160
(cd /tmp && timeout 400 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,baseline \
  --baseline-batches 64 --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "copy bandwidth|decode b|offline|static batch" $OUT/e2e.log | grep INFO | cut -c1-200
sed -n '/headline/,$p' $OUT/e2e.log
