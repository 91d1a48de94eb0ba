# Session 18, call 4: the start-up profile over a whole max_num_batched_tokens step (sequences
# of max_model_len); expandable segments dropped again (call 3: no smaller gap between
# reserved and allocated memory). GPU tests of the engine start-up paths, the 24 GB card.
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py tests/test_kv_cache_gpu.py tests/test_kernels_gpu.py -k "not decode_32x2048 and not chunked and not full_shapes and not group_sizes" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
timeout 200 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios card24 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -E "card|Error|error" $OUT/e2e.log | tail -6
grep -E "CUDA graph|KV cache" $OUT/e2e/*.log | head -3
timeout 120 python3 benchmarks/graph_memory.py --ckpt /tmp/edge-llm-bench/llama2-7b-awq-g128 --out $OUT/gm > $OUT/gm.log 2>&1; grep -v "^\s*$" $OUT/gm.log | grep -v "Loading weights" | tail -16
