# Session 14, call 2: the GPU tests of the changed one-row GEMV (one scale row per quantization
# group, the zero point folded into the PTX constants), decode split sum (unrolled) and chunked
# dequantize; the probe again (before: call 1, auto 0.44/0.25/0.43/0.41 of copy bandwidth;
# decode with V loaded early and more splits summed in the kernel); the 1 and 4 row sweep;
# above 64 rows dequantize + cuBLAS in L2-sized column chunks against the whole matrix.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_splitk_gpu.py tests/test_fuse_gpu.py > $OUT/tests.log 2>&1)
timeout 110 python3 benchmarks/gemv_probe.py --out $OUT > $OUT/probe.txt 2>&1; cut -c1-300 $OUT/probe.txt | grep -v Warn
timeout 90 python3 benchmarks/gemv_sweep.py --ms 128,256 --only dequant --out $OUT/sweep-big > $OUT/sweep-big.txt 2>&1; head -n 3 $OUT/sweep-big.txt | cut -c1-300
timeout 140 python3 benchmarks/gemv_sweep.py --ms 1,4 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 3 $OUT/sweep.txt | cut -c1-400
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
