# Session 12, call 1: session 11's unrun GPU tests (sampler without host syncs, staged reads
# one file at a time, split K, kernels, warm-up, merges) and the joined fp16 planes; then the
# per-shape sweep (GEMV grid at 1-2 rows, joined planes at 8-256 rows).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampler_gpu.py tests/test_staged_read_gpu.py tests/test_splitk_gpu.py tests/test_w4a16_planes_gpu.py tests/test_kernels_gpu.py tests/test_warmup_gpu.py tests/test_fuse_gpu.py tests/test_kernels_fused_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 300 python3 benchmarks/gemv_sweep.py --out $OUT/sweep > $OUT/sweep.txt 2>&1; tail -n 95 $OUT/sweep.txt
