# Session 18, call 6: decode at batch 1/4/16 of this session's code against session 17's last
# commit (aeaded5, unpacked from old18.tar), interleaved new/old/new/old in one call.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old18.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2 old2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; b=/tmp/old/benchmarks; else pp=$PYTHONPATH; b=$PWD/benchmarks; fi
  (cd /tmp && PYTHONPATH=$pp timeout 100 python3 $b/e2e.py --shapes llama2-7b --scenarios decode --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | tr '\n' ' ')"
done
