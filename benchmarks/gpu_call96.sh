# Session 28 (written without a device; NOT run). The serving scenario with steps capped while
# requests decode (`--max-tokens-with-decodes auto`: at most 512 tokens, the largest
# short-step CUDA graph, so a joining prompt is chunked into graph-replayed steps) against no
# cap (the default), interleaved 0 / auto / 0 / auto. Session 27 call 1, no cap: 3.0% / 5.9%
# of forwards eager at 32 / 64 streams, inter-token p99 30.8 / 54.6 ms, first token p50 270 /
# 393 ms, 4,101 / 5,167 tok/s. With the cap the eager share at 32 / 64 should fall to ~0.
# If auto wins on inter-token p99 without losing throughput or first tokens, it becomes the
# server's default (edge_llm/flags.py).
# Session 29's emulation (benchmarks/serving_host.py, BENCHMARKS.md): with the cap, first
# token p50 1.4-2.3x sooner and throughput within 1.3% at 8-64 streams; inter-token p99 2-2.7x
# lower at 32-64 streams but ~3x higher at 8-16 (more, shorter chunked steps). Look at p99 at
# c=8 here too.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
for run in off1 auto1 off2 auto2; do
  v=0; [[ $run == auto* ]] && v=auto
  (cd /tmp && EDGE_LLM_MAX_TOKENS_WITH_DECODES=$v timeout 130 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios serving --out $OUT/$run > $OUT/$run.log 2>&1)
  echo "$run"; grep -E "INFO e2e: serving c=" $OUT/$run.log | sed 's/^.*INFO e2e: //' | cut -c1-160
done
