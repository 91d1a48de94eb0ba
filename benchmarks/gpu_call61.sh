# Session 21, call 11: with DISABLE_MMA_V3=1 (mma.sync, as on sm_89), the split plane dots'
# stages, tile width, warps and split rule around the dispatched tile, 4 and 16 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
DISABLE_MMA_V3=1 timeout 150 python3 benchmarks/gemv_sweep.py --ms 4,16 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 3 $OUT/sweep.txt | cut -c1-700
grep FAILED $OUT/sweep/gemv_sweep.log | head -3
