# Session 12, call 2: the new dispatch (gemv16 split for ~2.5 programs per multiprocessor at
# 1-2 rows; fp16 planes joined in k order at 5-64 rows) under the W4A16 GPU tests; joined
# planes in k order at 128-1024 rows against dequantize + cuBLAS; then the dispatched path
# against fp16 cuBLAS at every row count (and paged decode attention).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w4a16_planes_gpu.py tests/test_splitk_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 150 python3 benchmarks/gemv_sweep.py --ms 32,64,128,256,1024 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -4 $OUT/sweep.txt
OUT=$OUT timeout 230 python3 benchmarks/kernels.py --quick > $OUT/kernels_quick.log 2>&1; sed -n '/==== W4A16/,$p' $OUT/kernels_quick.log | head -40
