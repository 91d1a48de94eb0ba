# Session 28 (written without a device; NOT run). The one-row GEMV asks L2 for its first K
# tiles' words, scales and zeros before its PDL wait (EDGE_LLM_GEMV_PREFETCH=N tiles,
# kernels/w4a16_gemv.py PREFETCH). With PDL a kernel's programs are resident while the
# kernel before it (attention, a norm, another GEMV) still runs; the weights never depend on
# it, so their first DRAM round trips can overlap its tail. Compiled for sm_90 on the CPU:
# the prefetches precede griddepcontrol.wait and the loop is unchanged
# (tests/test_kernels_compile.py); the interpreter checks the lines cover the first tiles.
# Here: the PDL exactness test with the prefetch on (outputs equal PDL off), then decode at
# batch 1 / 2 / 4 with 0 / N / 0 / N for N = 1, 4 and 32 (32: a whole 4,096-row split).
# If one wins at batch 1, it becomes the default (kernels/w4a16_gemv.py gemv_prefetch).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && EDGE_LLM_GEMV_PREFETCH=4 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_pdl_gpu.py > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log)
for n in 4 1 32; do
  echo "prefetch $n"
  TAG=p$n decode_switch EDGE_LLM_GEMV_PREFETCH 1,2,4 $n
done
