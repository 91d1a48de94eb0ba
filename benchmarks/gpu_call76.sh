# Session 24, call 1: session 23's gpu_call75.sh (never run: plane-packed words per kernel
# under DISABLE_MMA_V3=1 at 3-64 rows; offline packed against not, interleaved twice; on wgmma
# the joined tile with its columns in plane order at 24-64 rows), then gemv_probe.py with
# fp16 cuBLAS beside the loads-only ceiling (session 14 measured it at 3.0-3.35x).
# `bash benchmarks/gpu_call76.sh` runs the kernels; `... offline` the offline runs alone.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
M=3,4,8,16,24,32,48,64
DISABLE_MMA_V3=1 timeout 150 python3 benchmarks/gemv_sweep.py --ms $M --only none --out $OUT/std > $OUT/std.log 2>&1
DISABLE_MMA_V3=1 timeout 200 python3 benchmarks/gemv_sweep.py --ms $M --planes --out $OUT/planes > $OUT/planes.log 2>&1
grep -E "^M=" $OUT/std.log | cut -c1-60
grep -E "^M=" $OUT/planes.log | cut -c1-200
if [[ ${1:-kernels} == offline ]]; then
for run in packed1 std1 packed2 std2; do
  flag=0; [[ $run == packed* ]] && flag=1
  (cd /tmp && EDGE_LLM_PLANE_PACKED=$flag timeout 120 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios offline --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'offline' $OUT/$run.log | grep INFO | sed 's/.*offline/offline/' | tr '\n' ' ' | cut -c1-220)"
done
exit 0
fi
timeout 150 python3 benchmarks/gemv_sweep.py --ms 24,32,48,64 --planes --out $OUT/pm > $OUT/pm.log 2>&1
grep -E "^M=" $OUT/pm.log | cut -c1-220
timeout 150 python3 benchmarks/gemv_probe.py --out $OUT/probe > $OUT/probe.log 2>&1
grep -vE "^decode" $OUT/probe.log | cut -c1-400
