# Session 21, call 1: swap tiles of 64-256 activation rows and 64-256 weight columns, 2-4
# stages, split K or not, at 64-1024 rows against dequantize + cuBLAS (the dispatch there).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 560 python3 benchmarks/gemv_sweep.py --ms 64,128,256,1024 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 5 $OUT/sweep.txt | cut -c1-700
grep -c "M=" $OUT/sweep/gemv_sweep.log; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
