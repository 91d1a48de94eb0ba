# Written in session 16, NOT run there (device time spent): the host-work changes on the GPU
# (final-only outputs for LLM.generate, numpy block tables, CompletionOutput.snapshot) and
# the decode step they act on. GPU tests of the graph path, the 160-row step (kernel tally
# against the wall step: call 6 had a 7.7 ms gap), then #7's offline scenario with
# transformers' baseline in the same process.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_kv_fp8_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
build_checkpoints $OUT/build.log awq
timeout 150 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 160 --prompt 800 --steps 8 --kv-gib 100 --out $OUT/prof > $OUT/prof.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof.log | head -3
timeout 290 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios offline,baseline --baseline-batches 64 --budget-s 280 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A6 "headline"
grep -E "FAILED|Error" $OUT/tests.log | head -8
