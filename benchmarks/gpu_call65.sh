# Session 22, call 3: e2e decode at batch 32 and 64 with DISABLE_MMA_V3=1 (mma.sync, the
# 4090's kind of code), this checkout against b17790d (before the 17-64 row plane dots;
# old22.tar, carried), interleaved new/old/new/old; both run this checkout's benchmarks/.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old22.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2 old2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; else pp=$PYTHONPATH; fi
  (cd /tmp && DISABLE_MMA_V3=1 PYTHONPATH=$pp timeout 200 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 32,64 --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | tr '\n' ' ')"
done
(cd /tmp && PYTHONPATH=/tmp/oldsite:$PYTHONPATH python3 -c "import edge_llm.kernels.w4a16_config as c; print('old module', c.__file__)")
