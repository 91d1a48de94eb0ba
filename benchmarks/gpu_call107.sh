# Session 32 (written without a device; NOT run). The fp8 KV cache's values stored
# token-minor (kernels/paged_common.value_cache, default on; EDGE_LLM_V_TOKEN_MINOR=0 goes
# back): each block's tokens contiguous, so decode / prefill attention read the p @ v tile
# in 16-byte runs instead of one shared-memory byte load per code (no 8-bit ldmatrix.trans;
# Triton 3.6 sm_89 decode: 166 -> 108 registers, 1,448 -> 1,216 SASS instructions).
# 1. GPU tests of the fp8 cache, both layouts (writes bit for bit, attention against the
#    reference, the engine's graphs against eager; nothing compiles while serving).
# 2. decode_probe: the offline scenario's MHA step (160 x 800) and 32 x 2,048 at GQA 8,
#    fp16 / fp8 token-major / fp8 token-minor (session 16: fp8 only 0.53 of copy bandwidth
#    at 160 x 800, 1.08x fp16).
# 3. Offline (256 requests) with --kv-cache-dtype fp8, the switch 1 / 0 (#7's offline lever:
#    attention is 0.60 of a 160-row step at fp16 copy bandwidth).
# ~8 min. If 2 and 3 gain: keep the default, record; if they lose: default 0.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kv_fp8_gpu.py tests/test_warmup_gpu.py -k "fp8 or first_requests" > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
(cd /tmp && timeout 100 python3 $OLDPWD/benchmarks/decode_probe.py --cases 5,0 --out $OUT/probe.json > $OUT/probe.log 2>&1; grep -E "copy|auto \||1 split \||Error" $OUT/probe.log | grep -v "fp8 int |" | cut -c1-120)
for v in 1 0; do
  (cd /tmp && EDGE_LLM_V_TOKEN_MINOR=$v timeout 150 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios offline --kv-cache-dtype fp8 --out $OUT/off$v > $OUT/off$v.log 2>&1)
  echo "token-minor=$v $(grep -E 'INFO e2e: offline' $OUT/off$v.log | sed 's/^.*INFO e2e: //' | cut -c1-160)"
done
find $OUT -name '*.png' -delete
