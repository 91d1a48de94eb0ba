# Session 21, call 3: the swap kernel's plane dots with x's tile split into planes in
# registers (x_split) against x given in plane order (x_planes) and the dispatch, 4-64 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 300 python3 benchmarks/gemv_sweep.py --ms 4,8,16,32,64 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 6 $OUT/sweep.txt | cut -c1-600
grep -A40 "best variant" $OUT/sweep.txt | head -41; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
