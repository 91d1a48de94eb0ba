# Session 28 (written without a device; NOT run). Kernels ask L2 for what they will read first
# before their PDL wait, while the kernel before them still runs:
# - the one-row GEMV its first K tiles' words, scales and zeros (EDGE_LLM_GEMV_PREFETCH=N
#   tiles, kernels/w4a16_gemv.py PREFETCH): weights never depend on the kernel before;
# - decode attention its split's first tiles of keys and values (EDGE_LLM_DECODE_PREFETCH=N,
#   kernels/paged_decode.py PREFETCH; reads the context length and block table early, which
#   no kernel of a forward writes).
# Compiled for sm_90 on the CPU: the prefetches precede griddepcontrol.wait and the loops are
# unchanged (tests/test_prefetch_compile.py); the interpreter checks what they cover.
# Here: the PDL exactness test with both on (outputs equal to PDL off), then decode at batch
# 1 / 2 / 4 with 0 / N / 0 / N: the GEMV at N = 4 and 32 (32: a whole 4,096-row split), the
# attention at N = 1 (the scenario's contexts, 129-384 tokens, split in 64-token tiles).
# A winner at batch 1 becomes the default (kernels/pdl.py prefetch_tiles callers).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && EDGE_LLM_GEMV_PREFETCH=4 EDGE_LLM_DECODE_PREFETCH=1 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_pdl_gpu.py > $OUT/tests.log 2>&1; tail -2 $OUT/tests.log)
echo "attention prefetch 1"
TAG=d1 decode_switch EDGE_LLM_DECODE_PREFETCH 1,2,4 1
for n in 4 32; do
  echo "GEMV prefetch $n"
  TAG=p$n decode_switch EDGE_LLM_GEMV_PREFETCH 1,2,4 $n
done
