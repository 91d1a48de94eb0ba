# Session 15, call 1: the GPU tests of session 14's refactored rotary / K-V write kernels
# (fused, kernels, engine with graphs), then #7's full offline scenario (256 requests, prompts
# 128-1,024, outputs 128-512) against transformers' static batch of 64 (its best in the
# issue's anchors: 712 tok/s against 365 at 32).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_fused_gpu.py tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1)
timeout 370 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios offline,baseline --baseline-batches 64 --budget-s 350 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A8 "headline"; grep -i "offline\|static batch" $OUT/e2e.txt | tail -4
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
