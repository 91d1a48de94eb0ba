# Session 32 (written without a device; NOT run). Keys gathered by whole blocks
# (paged_common.load_k_tile: one table read and one base address per block of a key tile,
# not per token; Triton 3.6 decode loop 629 -> 577 instructions a tile fp16 on sm_89, 605 ->
# 555 on sm_90; prefill 1,129 -> 1,043 and 771 -> 702), which also serves the fp16 cache.
# 1. The attention GPU tests (decode, prefill, graphs' layouts) on the new gather.
# 2. e2e decode b1/b4/b16 (fp16 cache) against session 31's last commit, interleaved;
#    carry old108.tar (git archive -o old108.tar d075d66).
# The offline scenario new / old is gpu_call109.sh.
# ~7 min. If 2 (or gpu_call109.sh) loses beyond noise, go back to per-token keys for fp16 (the fp8
# token-minor gains stay apart: gpu_call107.sh).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_prefill_graphs_gpu.py -k "decode or prefill or write_kv or graph" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
decode_interleaved old108.tar
find $OUT -name '*.png' -delete
