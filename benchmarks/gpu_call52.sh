# Session 21, call 2: the swap kernel's eight plane dots with x's columns in plane order per
# K tile (x_planes; no layout conversion through shared memory in the loop), 4-1024 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 500 python3 benchmarks/gemv_sweep.py --ms 4,16,64,128,256,1024 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 7 $OUT/sweep.txt | cut -c1-600
grep -c "M=" $OUT/sweep/gemv_sweep.log; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
