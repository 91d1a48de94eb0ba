# Session 31: does prefill attention's key split cost short fresh prompts their first token?
# Inside the prefill graphs the split is planned for max_model_len (4,096), not the step's
# context, and the grid counts every sequence slot of the graph as a q tile (K = bucket + 1):
# so Llama-2's heads never split in a graph (bucket 8: 9 tiles x 32 kv heads >= 132
# multiprocessors), while Qwen2.5's 4 kv heads split at buckets 8 and 16 (36 and 72
# programs), also for a fresh prompt with no cached keys, where only the first partition
# has work and the merge launch and fp32 partials are pure cost. benchmarks/ttft.py on
# random Qwen2.5-7B AWQ g128 (fresh prompts, prefix caching off; "graphs" replays the
# prefill graphs) with EDGE_LLM_PREFILL_SPLIT 0 / 1 / 0 / 1; 32 tokens (bucket 32, never
# split) is the control. ~5 min.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
CK_SHAPE=qwen2.5-7b build_checkpoints $OUT/build.log awq
ttft_switch EDGE_LLM_PREFILL_SPLIT /tmp/ck-awq 8,16,32
