# Session 21, call 10: with DISABLE_MMA_V3=1 (mma.sync, as on sm_89), the fused "dot" kernel
# (joined fp16 planes) at 96-256 rows against dequantize + cuBLAS.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
DISABLE_MMA_V3=1 timeout 200 python3 benchmarks/gemv_sweep.py --ms 96,128,256 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 4 $OUT/sweep.txt | cut -c1-500
grep FAILED $OUT/sweep/gemv_sweep.log | head -3
