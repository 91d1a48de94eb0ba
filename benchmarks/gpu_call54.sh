# Session 21, call 4: the plane dots with x copied into plane order inside the call (as
# w4a16_matmul would dispatch them) against the dispatched joined tile, 3-16 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 300 python3 benchmarks/gemv_sweep.py --ms 3,4,8,16 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 5 $OUT/sweep.txt | cut -c1-400
tail -9 $OUT/sweep.txt; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
