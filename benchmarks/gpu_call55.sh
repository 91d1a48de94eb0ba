# Session 21, call 5: the swap kernel compiled for mma.sync (DISABLE_MMA_V3=1: what the 4090
# runs) with x's planes split in registers (x_split), against the joined tile under the same
# setting (auto) and the earlier runs' wgmma numbers, 3-64 rows.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
DISABLE_MMA_V3=1 timeout 300 python3 benchmarks/gemv_sweep.py --ms 3,4,8,16,32,64 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 7 $OUT/sweep.txt | cut -c1-500
tail -9 $OUT/sweep.txt; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
