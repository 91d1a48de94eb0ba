# Session 31: #7's offline point, last measured in session 24 (gpu_call78: 8.48x transformers'
# static batch of 64 in the same process). Since then: prefill graphs up to 512 tokens,
# warm-ups through one layer, the token cap (off), decode prefetch and the SiLU epilogue (on
# for one row), prefill attention's split keys. The same command as gpu_call78, one process:
# decode, offline (256 requests) and the baseline, so the ratio has its own denominator.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && timeout 400 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,baseline --baseline-batches 64 --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (decode|offline|baseline|transformers)" $OUT/e2e.log | cut -c1-220
sed -n '/headline/,$p' $OUT/e2e.log | head -20
# Session 32: the fp8 cache's offline run beside it (values token-minor by default since
# session 32), against the same call's baseline above
(cd /tmp && timeout 140 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios offline --kv-cache-dtype fp8 --out $OUT/e2e_fp8 > $OUT/e2e_fp8.log 2>&1)
grep -E "INFO e2e: offline" $OUT/e2e_fp8.log | sed 's/^.*INFO e2e: /fp8: /' | cut -c1-200
find $OUT -name '*.png' -delete
