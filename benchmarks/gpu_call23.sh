# Session 14, call 3: above 64 rows, dequantize + cuBLAS in L2-sized column chunks and the
# stage-4 swap tiles against the whole-matrix dequantize (128 and 256 rows); then end to end
# with this session's kernels (decode fractions of the floor, offline vs transformers).
set -u
source benchmarks/gpu_setup.sh
timeout 200 python3 benchmarks/gemv_sweep.py --ms 128,256 --out $OUT/sweep-big > $OUT/sweep-big.txt 2>&1; head -n 3 $OUT/sweep-big.txt | cut -c1-400; grep -A20 "best variant" $OUT/sweep-big.txt | cut -c1-120
timeout 200 python3 benchmarks/e2e.py --quick --scenarios decode,offline,baseline --budget-s 170 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A14 "headline"
