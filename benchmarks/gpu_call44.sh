# Written in session 19, which had no device time left (session 18 spent the stop's budget),
# for the next session's first call. The GPU tests session 18 could not re-run (graph-memory
# probe skipped under an explicit KV size, shared dequantization buffers, the isolated GPU
# tests) and the new folded-zero-point GEMV test; then the 1-2 row GEMV sweep: K tiles of one
# quantization group (one scale/zero row per tile instead of one per word), 64-256 columns,
# 4/8 warps, the zero point subtracted per word or folded into the PTX constants.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 250 python3 benchmarks/gemv_sweep.py --ms 1,2 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 3 $OUT/sweep.txt | cut -c1-900
grep -A20 "best variant" $OUT/sweep.txt | head -20; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
# next: copy $OUT/sweep/gemv_sweep.json to notes/run19_call1/sweep/ and run gpu_call45.sh
