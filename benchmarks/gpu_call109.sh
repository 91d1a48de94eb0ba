# Session 32 (written without a device; NOT run). The block-wise key gather's effect on the
# fp16 cache beyond batch 16 (gpu_call108.sh has the tests and decode b1/4/16):
# 1. decode_probe on the fp16 rows at the e2e decode scenario's short contexts (1 / 4 / 16 x
#    256, the split grid a graph sizes for 4,096; session 22: 7.6 / 12.7 / 21.5 us) and at
#    160 x 800 (session 16: 0.99 of copy bandwidth);
# 2. the offline scenario (fp16 cache) new, old, new, old; carry old108.tar (as gpu_call108).
# ~8 min.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && timeout 90 python3 $OLDPWD/benchmarks/decode_probe.py --cases 6,7,8,5 --fp8 0 --max-len 4096 --out $OUT/probe.json > $OUT/probe.log 2>&1; grep -E "copy|auto \||1 split \||Error" $OUT/probe.log | cut -c1-120)
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old108.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2 old2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; b=/tmp/old/benchmarks; else pp=$PYTHONPATH; b=$PWD/benchmarks; fi
  (cd /tmp && PYTHONPATH=$pp timeout 100 python3 $b/e2e.py --shapes llama2-7b --scenarios offline --out $OUT/off_$run > $OUT/off_$run.log 2>&1)
  echo "$run $(grep -E 'INFO e2e: offline' $OUT/off_$run.log | sed 's/^.*INFO e2e: //' | cut -c1-160)"
done
find $OUT -name '*.png' -delete
