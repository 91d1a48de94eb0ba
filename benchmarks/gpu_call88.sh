# Written at the end of session 25, NOT run there (device time spent). Issue #6's
# scale-from-zero start measured 15.7-15.8 s (target < 15 s; session 11: 11.8 s). Where the
# construction's time goes now: `profile_engine.py` (cProfile of LLM(...) on a warm compile
# cache; cumulative time per function), the serve start's phase lines of a warm start, and
# the cold start again to compare against a fix.
# Session 26 (still not run: no device lent): `edge-llm serve` now prefetches the
# checkpoint into the page cache while it imports torch (edge_llm/model/prefetch.py);
# start 2's weight_load phase (3.57 s in session 25 call 9, 1.1-1.4 s from a warm page
# cache) says whether it worked.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && timeout 200 python3 $OLDPWD/benchmarks/profile_engine.py --out $OUT/prof --top 40 > $OUT/prof.log 2>&1; grep -E "warm-up|graph memory|KV cache:|CUDA graphs|Loaded" $OUT/prof.log | sed 's/^.*INFO //' | cut -c1-170; head -60 $OUT/prof/profile_engine.txt)
(cd /tmp && timeout 300 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold > $OUT/cold.log 2>&1; tail -6 $OUT/cold.log)
