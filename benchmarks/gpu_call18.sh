# Session 13, call 4 (call 2's GPU tests timed out at tl.gather in the permuted norm, which
# hung on Triton 3.6; reverted): AWQ vs act-order decode with graphs, bracketed, then the GPU
# tests of the swap kernel, the fused norms (permuted), the gather kernel and the fold.
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.txt awq gptq-act
for f in awq gptq-act awq; do
  timeout 70 python3 benchmarks/decode_graphs.py --graphs-only --reps 3 --ckpt /tmp/ck-$f --out $OUT/dg-$f.json > $OUT/dg-$f.txt 2>&1; grep -A3 "batch" $OUT/dg-$f.txt | tail -3 | sed "s/^/$f /"
done
(cd /tmp/checks && timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_gpu.py tests/test_fuse_gpu.py tests/test_w4a16_swap_gpu.py tests/test_splitk_gpu.py 2>&1 | tail -4)
