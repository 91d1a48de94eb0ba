# Session 27. PDL now defaults to "auto" (forwards of at most 4 tokens; gpu_call91.sh: 1.06x /
# 1.04x / 1.02x at 1 / 2 / 4 rows, 0.99x at 8, 0.94x at 16): exactness with 1 and auto, then
# decode at batch 1 / 4 / 16 with the default. Then the cold start with per-start switches:
# gpu_call91.sh measured start 2 at 22.1 s (import 7.3 s, weight load 5.2 s from a 1.2 GB/s
# disk) and a warm start at 14.8 s: is the serve-start prefetch (competing with torch's own
# reads) to blame, and do expandable segments slow the start-up's allocations?
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_pdl_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
(cd /tmp && timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --out $OUT/auto > $OUT/auto.log 2>&1)
echo "auto $(grep -E 'decode b' $OUT/auto.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/' | tr '\n' ' ')"
(cd /tmp && timeout 420 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold --starts 7 --cold-starts 5 \
  --start-env 3:EDGE_LLM_PREFETCH=0 --start-env 5:EDGE_LLM_PREFETCH=0 \
  --start-env 6:EDGE_LLM_EXPANDABLE_SEGMENTS=0 > $OUT/cold.log 2>&1)
grep -E "INFO e2e: (start|plain)" $OUT/cold.log | sed 's/^.*INFO e2e: //' | cut -c1-260
sed -n '/cold start (/,$p' $OUT/cold.log | tail -8
