# Session 25: call 7's cold start had start 2 at 15.7 s (session 11: 11.8) and start 3 at
# 12.1 s (8.2). Where does a warm start's time go now? `edge-llm serve` started to /health
# 200 with warm page and compile caches, its start-up log lines kept: the default, without
# expandable segments, without prefill graphs, and the default again.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
build_checkpoints $OUT/build.log awq
start() {  # start NAME ENV...: one serve start to ready, its phase lines
  local name=$1; shift
  local t0=$(date +%s%N)
  (cd /tmp && env "$@" python3 -m edge_llm.cli serve /tmp/ck-awq --port 8011 --no-log-requests > $OUT/serve_$name.log 2>&1) &
  local pid=$!
  for i in $(seq 1 600); do curl -sf localhost:8011/health > /dev/null 2>&1 && break; sleep 0.1; done
  local t1=$(date +%s%N)
  pkill -TERM -f "edge_llm.cli serve" ; wait $pid 2>/dev/null
  echo "== $name: ready after $(( (t1 - t0) / 1000000 )) ms"
  grep -E "startup phase|warm-up|graph memory|KV cache:|CUDA graphs|Loaded|Merged|Plane|context" $OUT/serve_$name.log | sed 's/^.*INFO //' | cut -c1-170
}
start compile X=1 > /dev/null
start default X=1
start es0 EDGE_LLM_EXPANDABLE_SEGMENTS=0
start pg0 EDGE_LLM_PREFILL_GRAPHS=0
start default2 X=1
