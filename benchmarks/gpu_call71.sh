# Session 23, call 1. (1) gpu_call70's engine GPU tests (session 22's seeded-sampling restore
# of dropped run-ahead steps and its refactor had not run on a GPU). (2) cuBLAS on the
# dequantized weight: [K, N] against [N, K], eager against graph-replayed (session 17 saw
# 5.9 ms in graphs against 4.7 eager at 160 rows). (3) gpu_call70's decode-step profile with
# the run-ahead mode, batch 1 and 160.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_sampler_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 200 python3 benchmarks/cublas_layout.py --out $OUT/cublas_layout.json > $OUT/cublas_layout.log 2>&1
sed -n '/^speed-up/,$p' $OUT/cublas_layout.log | cut -c1-200 | head -60
build_checkpoints $OUT/build.log awq
timeout 300 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 1,160 --prompt 800 \
  --steps 8 --kv-gib 100 --max-model-len 4096 --top 6 --out $OUT/prof > $OUT/prof.log 2>&1
grep -E "graph step|host phases|^batch" $OUT/prof.log
