# Session 25, call 3: call 2 found serving's allocator growing by 752 MiB of new segments for
# the dequantize path's matmul outputs (2 x 344 MiB + 64 MiB: steps of other token counts
# split the profile's cached blocks), 1.0062 of a 0.18 x H200 budget. Does the allocator's
# expandable-segments mode keep serving inside the plan, and do the CUDA graphs work with it?
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
build_checkpoints $OUT/build.log awq
for mode in es plain; do
  if [[ $mode == es ]]; then export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; else unset PYTORCH_CUDA_ALLOC_CONF; fi
  echo "== $mode"
  (cd /tmp && timeout 150 python3 $OLDPWD/benchmarks/serving_memory.py --ckpt /tmp/ck-awq --util 0.18 --out $OUT/sm_$mode > $OUT/sm_$mode.log 2>&1; grep -v "INFO\|Loading" $OUT/sm_$mode.log | tail -14; grep "KV cache:" $OUT/sm_$mode.log | cut -c1-150)
done
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(cd /tmp && timeout 150 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios card24,decode --out $OUT/e2e > $OUT/e2e.log 2>&1; grep "card\|decode b" $OUT/e2e.log | grep -v "|" | cut -c1-160)
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log)
