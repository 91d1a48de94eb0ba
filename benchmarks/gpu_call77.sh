# Session 24, call 7: the W4A16 dispatch on plane-packed words (Hopper: the joined tile in
# plane order at 33-64 rows, and over 128-row tiles at 65-128 rows for >= 16M weights) on
# the GPU tests, then the offline scenario against session 23's last commit (04fbabe, carried
# as old24.tar), interleaved new / old / new / old.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "plane_packed or w4a16" 2>&1 | tail -3)
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf old24.tar -C /tmp/old
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
for run in new1 old1 new2 old2; do
  if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; b=/tmp/old/benchmarks; else pp=$PYTHONPATH; b=$PWD/benchmarks; fi
  (cd /tmp && PYTHONPATH=$pp timeout 110 python3 $b/e2e.py --shapes llama2-7b --scenarios offline --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'offline' $OUT/$run.log | grep INFO | sed 's/.*offline/offline/' | tr '\n' ' ' | cut -c1-200)"
done
