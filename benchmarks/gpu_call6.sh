# session 11, device call 2: integer zero points folded into the fp16x2 PTX, split-K partials
# loaded all at once by the last program; GPU tests, the kernel table (with "general zeros" and
# "separate reduce" in the same run), decode with graphs, and the per-kernel profile
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_splitk_gpu.py tests/test_staged_read_gpu.py tests/test_kernels_gpu.py tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1); tail -4 $OUT/tests.log
timeout 120 python3 benchmarks/kernels.py --quick > $OUT/kernels_quick.log 2>&1; grep "M=    1 \|M=    4 \|M=   16 " $OUT/kernels_quick.log | cut -c1-140
timeout 80 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -5
timeout 120 python3 benchmarks/profile_kernels.py --batches 1,16 --prompt 128 --out $OUT > $OUT/profile.log 2>&1; grep -v Warn $OUT/profile.log | grep -A8 "^batch"
