# Session 14, call 1: where the one-row GEMV loses bandwidth (benchmarks/gemv_probe.py, which
# also times decode attention at short contexts with per-sequence partitions); the batch-1
# kernel tally with those partitions; stage-4 swap tiles at 128-256 rows (from gpu_call20);
# then the GPU tests of split K (session 13's sum_if_last refactor), swap and decode kernels.
set -u
source benchmarks/gpu_setup.sh
timeout 120 python3 benchmarks/gemv_probe.py --out $OUT > $OUT/probe.txt 2>&1; cut -c1-400 $OUT/probe.txt | grep -v Warn
build_checkpoints $OUT/build.log awq
timeout 80 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1 --out $OUT/prof-awq > $OUT/prof-awq.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof-awq.log | tail -12
timeout 170 python3 benchmarks/gemv_sweep.py --ms 128,256 --out $OUT/sweep-big > $OUT/sweep-big.txt 2>&1; head -n 8 $OUT/sweep-big.txt
(cd /tmp/checks && timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_splitk_gpu.py tests/test_w4a16_swap_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1); tail -4 $OUT/tests.log
