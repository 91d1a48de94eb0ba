# Session 22, call 1: the plane dots at 64-256 rows (never timed there) against the dispatch
# (dequantize + cuBLAS above 64 rows): x copied into plane order on wgmma, then both modes
# with DISABLE_MMA_V3=1 (mma.sync, the 4090's kind of code).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 270 python3 benchmarks/gemv_sweep.py --ms 64,128,256 --only planes --out $OUT/wgmma > $OUT/wgmma.txt 2>&1; head -n 4 $OUT/wgmma.txt | cut -c1-900
grep FAILED $OUT/wgmma/gemv_sweep.log | head -3
DISABLE_MMA_V3=1 timeout 270 python3 benchmarks/gemv_sweep.py --ms 64,128,256 --out $OUT/mma_sync > $OUT/mma_sync.txt 2>&1; head -n 4 $OUT/mma_sync.txt | cut -c1-900
grep FAILED $OUT/mma_sync/gemv_sweep.log | head -3
