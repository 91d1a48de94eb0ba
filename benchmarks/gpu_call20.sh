# Written in session 13, NOT run there (device time spent). The swap kernel's open questions:
# bigger tiles with stage-4 pipelines at 128-256 rows (against dequantize + cuBLAS), and bf16
# activations at 4-64 rows (fp32 unpacking, against the old bf16 paths); then #7's full
# offline scenario at 256 requests (its 10x target).
set -u
source benchmarks/gpu_setup.sh
timeout 200 python3 benchmarks/gemv_sweep.py --ms 128,256 --out $OUT/sweep-big > $OUT/sweep-big.txt 2>&1; head -n 8 $OUT/sweep-big.txt
timeout 150 python3 benchmarks/gemv_sweep.py --ms 4,16,64 --dtype bfloat16 --out $OUT/sweep-bf16 > $OUT/sweep-bf16.txt 2>&1; head -n 8 $OUT/sweep-bf16.txt
timeout 230 python3 benchmarks/e2e.py --scenarios offline,baseline --budget-s 210 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A8 "headline"
