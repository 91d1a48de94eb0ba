# Session 31 (written without a device; NOT run; after gpu_call105.sh). The cost side of
# EDGE_LLM_PREFILL_SPLIT_GRAPHS=1: fresh 8-128-token prompts' first token on random
# Llama-2-7B AWQ g128 (benchmarks/ttft.py, prefix caching off; the "graphs" column replays
# the prefill graphs, which with the flag plan 8 / 8 / 8 / 5 / 3 partitions at buckets 8-128
# for max_model_len 4,096; a fresh prompt's tiles have fewer keys than one partition's
# minimum, 256, so only the merge launch and the fp32 partials are extra). Flag 0 / 1 / 0 / 1.
# ~6 min.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
build_checkpoints $OUT/build.log awq
ttft_switch EDGE_LLM_PREFILL_SPLIT_GRAPHS /tmp/ck-awq 8,16,32,64,128
