# Session 14, call 2: the GPU tests of the changed one-row GEMV (one scale row per quantization
# group, the zero point folded into the PTX constants) and decode split sum (unrolled); the
# probe again (before: call 1, auto 0.44/0.25/0.43/0.41 of copy bandwidth; decode variants
# with V loaded early and more splits summed in the kernel); the 1-4 row tile sweep.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_splitk_gpu.py tests/test_fuse_gpu.py > $OUT/tests.log 2>&1)
timeout 120 python3 benchmarks/gemv_probe.py --out $OUT > $OUT/probe.txt 2>&1; cut -c1-330 $OUT/probe.txt | grep -v Warn
timeout 200 python3 benchmarks/gemv_sweep.py --ms 1,2,4 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 28 $OUT/sweep.txt | cut -c1-200
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
