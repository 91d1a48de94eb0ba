# Session 30. The two defaults flipped after gpu_call94 / 95 (BENCHMARKS.md, session 30):
# silu(gate) * up in the one-row GEMV's epilogue at one row (EDGE_LLM_GEMV_SILU) and decode
# attention's one-tile L2 prefetch before its PDL wait (EDGE_LLM_DECODE_PREFETCH=1).
# Here: their GPU tests under the new defaults, then decode at batch 1 / 2 / 4 with both off /
# the defaults / both off / the defaults.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_silu_gpu.py tests/test_pdl_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log)
for run in off1 on1 off2 on2; do
  vars=(); [[ $run == off* ]] && vars=(EDGE_LLM_GEMV_SILU=0 EDGE_LLM_DECODE_PREFETCH=0)
  (cd /tmp && env "${vars[@]}" timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches 1,2,4 --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/' | tr '\n' ' ')"
done
