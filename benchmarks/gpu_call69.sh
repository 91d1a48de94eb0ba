# Session 22, call 8: decode run-ahead at the offline scenario's batch sizes: e2e offline
# (256 requests, no baseline) against 722d37c (old22.tar, carried), new/old/new.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old22.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; b=/tmp/old/benchmarks; else pp=$PYTHONPATH; b=$PWD/benchmarks; fi
  (cd /tmp && PYTHONPATH=$pp timeout 170 python3 $b/e2e.py --shapes llama2-7b --scenarios offline --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'offline:' $OUT/$run.log | grep INFO | sed 's/.*offline/offline/' | tr '\n' ' ')"
done
