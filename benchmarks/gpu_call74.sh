# Session 23, call 5: the one-row GEMV on plane-packed words, three ways to read x
# (w4a16_gemv._x_pairs PLANES 1-3; 3 is the default: int32 words staged by cp.async like the
# standard path), against standard words; then e2e decode with the loader packing
# (EDGE_LLM_PLANE_PACKED=1) against not, same checkout, interleaved.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "plane_packed" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
timeout 100 python3 benchmarks/gemv_sweep.py --ms 1,2 --only none --out $OUT/std > $OUT/std.log 2>&1
timeout 150 python3 benchmarks/gemv_sweep.py --ms 1,2,4,16 --planes --out $OUT/planes > $OUT/planes.log 2>&1
grep -E "^M=" $OUT/std.log | cut -c1-60
grep -E "^M=" $OUT/planes.log | cut -c1-200
for run in packed1 std1 packed2 std2; do
  flag=0; [[ $run == packed* ]] && flag=1
  (cd /tmp && EDGE_LLM_PLANE_PACKED=$flag timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | cut -c1-40 | tr '\n' ' ')"
done
grep -h "Plane-packed" $OUT/packed1.log | head -1
