# Session 30 (written after the device time ran out; NOT run; after gpu_call100.sh). ~6 min.
# 1. The prefill kernel as a 3090 / 4090 compiles it (DISABLE_MMA_V3=1: mma.sync dots): at
#    GQA 5-7 it spills 80-104 bytes per thread (ptxas -v; BENCHMARKS.md, session 30), which
#    power-of-two rows per token remove (PrefillConfig.pow2_rows, "pow2 rows" column; 8
#    tokens per tile at GQA 7 instead of 9). If pow2 rows win on Qwen2.5's heads here,
#    they become the default for mma.sync GPUs (kernels/paged_prefill.py).
# 2. The prefix scenario (cached 1,000-token prompt + 24 new tokens; session 27: TTFT 7.1 ms
#    on, 5.8x) with prefill attention's split keys off / on / off / on
#    (EDGE_LLM_PREFILL_SPLIT). Session 31, reading the code: expect no difference. The 24 new
#    tokens replay the 32-token prefill graph, whose grid counts its 33 sequence slots as q
#    tiles (33 x 32 kv heads >= 132 multiprocessors), so that launch is never split.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && DISABLE_MMA_V3=1 timeout 240 python3 $OLDPWD/benchmarks/prefill_split.py --variants > $OUT/prefill_split_mma_sync.log 2>&1; cat $OUT/prefill_split_mma_sync.log)
prefix_switch EDGE_LLM_PREFILL_SPLIT
find $OUT -name '*.png' -delete
