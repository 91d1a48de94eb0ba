# Written in session 26 (no device lent; NOT run there). Programmatic dependent launch
# (kernels/pdl.py, EDGE_LLM_PDL=1, sm_90+): every kernel may start while the one before it
# finishes. First the exactness test (outputs with PDL == without, graphs and eager), then
# the decode scenario at batch 1 / 4 / 16 with PDL off / on / off / on in one call (session
# 25: 0.380 / 0.312 / 0.368 of the bandwidth floor). If it wins, the default flips to on.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_pdl_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
for run in off1 on1 off2 on2; do
  v=0; [[ $run == on* ]] && v=1
  (cd /tmp && EDGE_LLM_PDL=$v timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | tr '\n' ' ')"
done
