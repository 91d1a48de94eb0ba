# Session 20, call 2: the GEMV's tile loads staged through shared memory by cp.async
# (pipe_stages, tl.range's pipeliner) at 1-4 rows: the GPU tests of the new path, then the
# sweep of stages, tiles and waves against the dispatched kernels (register double buffering).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "gemv16" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 330 python3 benchmarks/gemv_sweep.py --ms 1,2,4 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 4 $OUT/sweep.txt | cut -c1-900
grep -A26 "best variant" $OUT/sweep.txt | head -26; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
