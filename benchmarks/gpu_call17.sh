# Session 13, call 2: GPU tests of the swap dispatch, decode attention with splits summed
# in-kernel, the act-order norm gather in registers and the column-gather kernel; the kernel
# table with the new dispatch; AWQ vs act-order decode with graphs, bracketed (AWQ, act, AWQ).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_w4a16_swap_gpu.py tests/test_kernels_gpu.py tests/test_kernels_fused_gpu.py tests/test_splitk_gpu.py tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py tests/test_w4a16_planes_gpu.py > $OUT/tests.txt 2>&1)
timeout 190 python3 benchmarks/kernels.py --quick > $OUT/kq.txt 2>&1; tail -n 30 $OUT/kq.txt
build_checkpoints $OUT/build.txt awq gptq-act
for f in awq gptq-act awq; do
  timeout 80 python3 benchmarks/decode_graphs.py --graphs-only --reps 3 --ckpt /tmp/ck-$f --out $OUT/dg-$f.json 2>&1 | grep -A3 "batch" | tail -3 | sed "s/^/$f /"
done
grep -E "passed|failed|Error" $OUT/tests.txt | tail -5
