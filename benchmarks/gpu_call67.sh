# Session 22, call 6: the 3-16 row mma.sync rule (x in plane order for large weights): the
# dispatch test in a DISABLE_MMA_V3 subprocess and the plane dots at full size, then e2e
# decode at batch 4 and 16 with DISABLE_MMA_V3=1 against 9d665eb (old22.tar, carried),
# interleaved new/old/new/old, both with this checkout's benchmarks/.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "mma_sync or plane_dots" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old22.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2 old2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; else pp=$PYTHONPATH; fi
  (cd /tmp && DISABLE_MMA_V3=1 PYTHONPATH=$pp timeout 200 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 4,16 --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | tr '\n' ' ')"
done
