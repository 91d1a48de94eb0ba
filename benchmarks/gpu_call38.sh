# Session 18, call 2: call 1's changes plus one reused dequantization buffer (no 32-180 MB
# tensor per linear above 64 rows) and the profile's peak taken from reserved memory. GPU
# tests of the graph paths and the W4A16 kernels, the 24 GB card scenario, the graph pools.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_kernels_gpu.py -k "not decode_32x2048 and not chunked" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 200 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios card24 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -E "card|Error|error" $OUT/e2e.log | tail -8
grep -E "CUDA graph|KV cache" $OUT/e2e/*.log 2>/dev/null | tail -5
timeout 150 python3 benchmarks/graph_memory.py --ckpt /tmp/edge-llm-bench/llama2-7b-awq-g128 --out $OUT/gm > $OUT/gm.log 2>&1; grep -v "^\s*$" $OUT/gm.log | grep -v "Loading weights" | tail -16
