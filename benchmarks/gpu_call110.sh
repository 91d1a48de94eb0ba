# Session 32 (written without a device; NOT run). fp16 values stored token-minor too
# (EDGE_LLM_V_TOKEN_MINOR=1, off by default): attention then reads the value tile through
# 16-byte copies and plain ldmatrix with one table read per block (Triton 3.6 decode loop
# 577 -> 387 instructions a tile on sm_89, 555 -> 378 on sm_90; prefill 1,043 -> 900, 702 ->
# 587); the writes store NaN as 0 and clamp infinities (the kernels read blocks whole).
# 1. Attention over fp16 / bf16 token-minor values against the reference; with the switch
#    on, the engines' graphs against eager and "first requests compile nothing".
# 2. decode_probe: fp16 token-major vs token-minor rows at 1 / 4 / 16 x 256 (graph split
#    grid for 4,096), 32 x 2,048 GQA 8 and 160 x 800.
# 3. e2e decode b1/4/16 with the switch 0 / 1 / 0 / 1.
# ~9 min. If 2 and 3 gain: default 1 for every dtype (paged_common.values_token_minor_for).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && EDGE_LLM_V_TOKEN_MINOR=1 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py -k "decode_32 or chunked or greedy_equals or replay or first_requests" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
(cd /tmp && timeout 100 python3 $OLDPWD/benchmarks/decode_probe.py --cases 6,7,8,0,5 --fp8 0 --max-len 4096 --out $OUT/probe.json > $OUT/probe.log 2>&1; grep -E "copy|auto \||1 split \||Error" $OUT/probe.log | cut -c1-120)
decode_switch EDGE_LLM_V_TOKEN_MINOR 1,4,16
find $OUT -name '*.png' -delete
