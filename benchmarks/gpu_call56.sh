# Session 21, call 6: the dispatch by MMA kind (plane dots over x in plane order at 3-16 rows
# and N >= 16,384 on Hopper; x split in registers on mma.sync, checked in a subprocess with
# DISABLE_MMA_V3=1): the W4A16 GPU tests and the engine with CUDA graphs (greedy against the
# torch reference); then e2e decode at batch 1/4/16 against session 20's last commit
# (62df0bc, from old21.tar), interleaved new/old/new/old.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_w4a16_swap_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
decode_interleaved old21.tar
