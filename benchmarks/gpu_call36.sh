# Session 17, call 4: the GPU tests of the graph and prefill-graph paths with async output
# processing on (the test that drives the scheduler by hand now runs with it off), and the
# decode steps' host phases in both output modes with the timing fixed (the async loop now
# waits for its last step before reading the clock).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR" $OUT/tests.log | head -5
build_checkpoints $OUT/build.log awq
timeout 170 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1,160 --prompt 800 \
  --steps 8 --kv-gib 100 --max-model-len 4096 --top 4 --out $OUT/prof > $OUT/prof.log 2>&1
grep -E "^batch|^graph step|^host|^error" $OUT/prof.log
