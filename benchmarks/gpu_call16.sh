# Session 13, call 1: the weights-left "swap" W4A16 kernel (tests, where its dot operand
# lives in the TTGIR, sweep against the dispatched choice at 4-256 rows); decode attention
# with the splits summed in the kernel (tests; default vs second launch vs fixed splits);
# then where act-order's extra time per batch-1 step goes (kernel tallies, AWQ vs act-order).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w4a16_swap_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 60 python3 benchmarks/swap_ir.py > $OUT/swap_ir.txt 2>&1; cut -c1-330 $OUT/swap_ir.txt
timeout 100 python3 benchmarks/kernels.py --quick --skip-w4 > $OUT/kq.txt 2>&1; grep "decode B" $OUT/kq.txt; cp /tmp/kernels_bench.json $OUT/ 2>/dev/null
timeout 260 python3 benchmarks/gemv_sweep.py --ms 4,16,64,256 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 40 $OUT/sweep.txt
build_checkpoints $OUT/build.log awq gptq-act
for f in awq gptq-act; do
  timeout 90 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-$f --batches 1 --out $OUT/prof-$f > $OUT/prof-$f.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof-$f.log | tail -14
done
