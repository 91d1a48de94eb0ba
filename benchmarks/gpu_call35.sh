# Session 17, call 3: async output processing (a step's outputs built while the next step
# runs; the GPU default now). GPU tests of the graph path (async against sync tokens), the
# 160-row and 1-row decode steps with both output modes (profile_kernels.py), then #7's
# decode and offline scenarios with transformers' baseline in the same process.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "FAILED|Error" $OUT/tests.log | head -5
build_checkpoints $OUT/build.log awq
timeout 170 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1,160 --prompt 800 \
  --steps 8 --kv-gib 100 --max-model-len 4096 --top 4 --out $OUT/prof > $OUT/prof.log 2>&1
grep -E "^batch|^graph step|^host|^error" $OUT/prof.log
timeout 330 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,baseline \
  --baseline-batches 64 --budget-s 320 --out $OUT/e2e > $OUT/e2e.txt 2>&1
grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A12 "headline"
