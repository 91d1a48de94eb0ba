# Session 18, call 3: expandable segments on by default (fragmentation while serving), a
# 64 MiB serving slack in the KV plan. GPU tests of the graph paths and the sleep/wake and
# kernel tests under the new allocator setting, the 24 GB card scenario, the graph pools.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_kernels_gpu.py -k "not decode_32x2048 and not chunked and not full_shapes" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 200 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios decode,card24 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -E "card|decode b|Error|error" $OUT/e2e.log | tail -10
timeout 120 python3 benchmarks/graph_memory.py --ckpt /tmp/edge-llm-bench/llama2-7b-awq-g128 --out $OUT/gm > $OUT/gm.log 2>&1; grep -v "^\s*$" $OUT/gm.log | grep -v "Loading weights" | tail -16
