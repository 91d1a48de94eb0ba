# Session 27 (written after the device was withdrawn; NOT run). Two start-up changes:
# 1. The memory probes are kept on disk (engine/probe_cache.py): start 2 onwards skips the
#    whole-step profile forward and the graph-memory capture (~1-3 s measured in gpu_call91's
#    profile). GPU tests first: nothing compiles while serving after a start that reused them.
# 2. gpu_call92.sh: the serve-start prefetch (posix_fadvise WILLNEED) gained little on start 2
#    (15.5 / 14.9 s with it, 16.1 / 15.0 s without; weight load 3.45-3.65 s against 3.71-3.87,
#    1.3 s from a warm page cache). Is the advice ignored on this machine's file system? The
#    prefetch can now read the bytes itself (EDGE_LLM_PREFETCH=read).
# Scale-from-zero starts (cold page cache, compile and probe caches reused): fadvise / read /
# off, probe cache off, then fadvise / read / off again. Start-2 target: ready < 15 s.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
echo "fs of /tmp: $(stat -f -c %T /tmp); cgroup memory.max: $(cat /sys/fs/cgroup/memory.max 2>&1 | head -1)"
(cd /tmp/checks && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log)
(cd /tmp && timeout 330 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold --starts 8 --cold-starts 8 \
  --start-env 2:EDGE_LLM_PREFETCH=fadvise --start-env 3:EDGE_LLM_PREFETCH=read --start-env 4:EDGE_LLM_PREFETCH=0 \
  --start-env 5:EDGE_LLM_PROBE_CACHE=0 \
  --start-env 6:EDGE_LLM_PREFETCH=fadvise --start-env 7:EDGE_LLM_PREFETCH=read --start-env 8:EDGE_LLM_PREFETCH=0 > $OUT/cold.log 2>&1)
grep -E "INFO e2e: (start|plain)" $OUT/cold.log | sed 's/^.*INFO e2e: //' | cut -c1-260
grep -h -E "Prefetch|Memory probes|Kernel warm-up" $OUT/cold/server*.log | sed "s/^.*INFO //" | cut -c1-200
sed -n '/cold start (/,$p' $OUT/cold.log | tail -10
