# Session 27. gpu_call92.sh: the serve-start prefetch (posix_fadvise WILLNEED) gained little
# on start 2 (15.5 / 14.9 s with it, 16.1 / 15.0 s without; weight load 3.45-3.65 s against
# 3.71-3.87, 1.3 s from a warm page cache). Is the advice ignored on this machine's file
# system? The prefetch now can read the bytes itself (EDGE_LLM_PREFETCH=read): scale-from-zero
# starts (cold page cache, compile cache reused) with fadvise / read / off, twice each.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
echo "fs of /tmp: $(stat -f -c %T /tmp); cgroup memory.max: $(cat /sys/fs/cgroup/memory.max 2>&1 | head -1)"
(cd /tmp && timeout 480 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold --starts 7 --cold-starts 7 \
  --start-env 2:EDGE_LLM_PREFETCH=fadvise --start-env 3:EDGE_LLM_PREFETCH=read --start-env 4:EDGE_LLM_PREFETCH=0 \
  --start-env 5:EDGE_LLM_PREFETCH=fadvise --start-env 6:EDGE_LLM_PREFETCH=read --start-env 7:EDGE_LLM_PREFETCH=0 > $OUT/cold.log 2>&1)
grep -E "INFO e2e: (start|plain)" $OUT/cold.log | sed 's/^.*INFO e2e: //' | cut -c1-260
sed -n '/cold start (/,$p' $OUT/cold.log | tail -9
