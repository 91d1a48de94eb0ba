# Session 14, call 2: the one-row GEMV with one scale row per quantization group and the zero
# point folded into the PTX constants (before: call 1's probe, auto 0.44/0.25/0.43/0.41 of
# copy bandwidth); V loaded with K in decode attention; the 1-2 row tile sweep; the GPU tests
# of the GEMV and decode kernels and the merged-model greedy tests; end to end quick.
set -u
source benchmarks/gpu_setup.sh
timeout 120 python3 benchmarks/gemv_probe.py --out $OUT > $OUT/probe.txt 2>&1; cut -c1-330 $OUT/probe.txt | grep -v Warn
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_splitk_gpu.py tests/test_fuse_gpu.py > $OUT/tests.log 2>&1)
timeout 150 python3 benchmarks/gemv_sweep.py --ms 1,2 --out $OUT/sweep12 > $OUT/sweep12.txt 2>&1; head -n 24 $OUT/sweep12.txt | cut -c1-200
timeout 170 python3 benchmarks/e2e.py --quick --scenarios decode,offline,baseline --budget-s 150 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A14 "headline"
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
