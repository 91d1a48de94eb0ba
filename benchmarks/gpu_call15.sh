# Written in session 12, NOT run there (device time spent): where act-order's extra time per
# batch-1 decode step goes (kernel tallies of AWQ vs act-order GPTQ; session 12 measured
# act-order at 0.83 of AWQ at batch 1 and 0.95-0.97 at 4-16), then the full (non-quick)
# offline scenario at 256 requests (#7's 10x target).
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq gptq-act
for f in awq gptq-act; do
  timeout 90 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-$f --batches 1 --out $OUT/prof-$f > $OUT/prof-$f.log 2>&1; grep -v "Warn\|INFO" $OUT/prof-$f.log | tail -16
done
timeout 330 python3 benchmarks/e2e.py --scenarios offline,baseline --budget-s 300 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | grep -A8 "headline"
