# Written in session 23, NOT run there (device time spent). (1) Plane-packed words per kernel
# under DISABLE_MMA_V3=1 (mma.sync, the 4090's kind of code) at 3-64 rows, against standard
# words with the dispatch (session 23 measured packed words on mma.sync end to end only:
# decode b4/b16/b32 1.11x/1.08x/1.07x). (2) The offline scenario with packed words against
# not, interleaved twice (call 8's 4,831 tok/s against call 2's 4,975 were one run each).
# (3) On wgmma, packed words at 24-64 rows: the joined tile with its columns in plane order
# (``joined pm``, no copy of x) against the dispatch (plane dots to 48, joined + copy at 64).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
M=3,4,8,16,24,32,48,64
DISABLE_MMA_V3=1 timeout 150 python3 benchmarks/gemv_sweep.py --ms $M --only none --out $OUT/std > $OUT/std.log 2>&1
DISABLE_MMA_V3=1 timeout 200 python3 benchmarks/gemv_sweep.py --ms $M --planes --out $OUT/planes > $OUT/planes.log 2>&1
grep -E "^M=" $OUT/std.log | cut -c1-60
grep -E "^M=" $OUT/planes.log | cut -c1-200
for run in packed1 std1 packed2 std2; do
  flag=0; [[ $run == packed* ]] && flag=1
  (cd /tmp && EDGE_LLM_PLANE_PACKED=$flag timeout 120 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios offline --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'offline' $OUT/$run.log | grep INFO | sed 's/.*offline/offline/' | tr '\n' ' ' | cut -c1-220)"
done
timeout 150 python3 benchmarks/gemv_sweep.py --ms 24,32,48,64 --planes --out $OUT/pm > $OUT/pm.log 2>&1
grep -E "^M=" $OUT/pm.log | cut -c1-220
