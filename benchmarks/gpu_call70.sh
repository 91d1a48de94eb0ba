# Written in session 22, NOT run there (device time spent). (1) The engine GPU tests after
# session 22's last changes (the seeded-sampling restore of dropped run-ahead steps, the
# PendingStep / request-state refactor): CUDA graphs, sampler, async engine. (2) Where a
# decode step's time goes now, with decode run-ahead as the third mode of profile_kernels
# (sync outputs / async outputs / run-ahead), at batch 1 and 160 (the offline steady state).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_sampler_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
build_checkpoints $OUT/build.log awq
timeout 300 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1,160 --prompt 800 \
  --steps 8 --kv-gib 100 --max-model-len 4096 --top 6 --out $OUT/prof > $OUT/prof.log 2>&1
grep -E "graph step|host phases|^batch" $OUT/prof.log
