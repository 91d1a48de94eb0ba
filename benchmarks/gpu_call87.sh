# Session 25, last call: KV tensors in plain segments (expandable segments stay on for the
# rest), 128 MiB slack, prefill graphs to 512 tokens: the graph and plan GPU tests, then
# issue #6's cold start (three serve starts, sleep / wake) against call 7's 32.0 / 15.7 /
# 12.1 s.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
(cd /tmp && timeout 200 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold > $OUT/cold.log 2>&1; tail -8 $OUT/cold.log)
