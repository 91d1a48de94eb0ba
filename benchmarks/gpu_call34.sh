# Session 17, call 2: the 30.0 ms 160-row decode step against its 25.5 ms of eager kernels
# (call 1) taken apart: the kernel tally inside CUDA graphs and the host phases of
# LLMEngine.step (profile_kernels.py), at the benchmark's own context limit and at the e2e
# profile's 4,096 (which sizes the graphs' attention grid), then with the fp8 cache.
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq
for cfg in "auto 0" "auto 4096" "fp8 4096"; do
  set -- $cfg
  timeout 170 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1,160 --prompt 800 \
    --steps 8 --kv-gib 100 --kv-cache-dtype $1 --max-model-len $2 --top 6 --out $OUT/prof-$1-$2 \
    > $OUT/prof-$1-$2.log 2>&1
  echo "== $cfg"; grep -E "^batch|^with|^host|^_paged|^_dequant|^error" $OUT/prof-$1-$2.log
done
