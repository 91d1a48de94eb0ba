# Session 21, call 8: with DISABLE_MMA_V3=1 (mma.sync, as on sm_89), the "dot" kernel with
# joined fp16 planes against the plane dots with x split in registers, 8-64 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
DISABLE_MMA_V3=1 timeout 300 python3 benchmarks/gemv_sweep.py --ms 8,16,24,32,48,64 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 7 $OUT/sweep.txt | cut -c1-400
grep FAILED $OUT/sweep/gemv_sweep.log | head -3
