# Session 14, call 1: where the one-row GEMV loses bandwidth (benchmarks/gemv_probe.py, which
# also times decode attention at short contexts with per-sequence partitions); the batch-1
# kernel tally with those partitions and rotary + K/V write in one launch; then the GPU tests
# of split K (session 13's sum_if_last refactor), swap, decode, the fused kernels and graphs.
set -u
source benchmarks/gpu_setup.sh
timeout 120 python3 benchmarks/gemv_probe.py --out $OUT > $OUT/probe.txt 2>&1; cut -c1-400 $OUT/probe.txt | grep -v Warn
build_checkpoints $OUT/build.log awq
timeout 80 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1 --out $OUT/prof-awq > $OUT/prof-awq.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof-awq.log | tail -12
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_splitk_gpu.py tests/test_w4a16_swap_gpu.py tests/test_kernels_gpu.py tests/test_kernels_fused_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
