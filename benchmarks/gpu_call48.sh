# Session 20, call 4: the new one-row dispatch (one-group K tiles, flat scales, loads staged
# 4 tiles ahead by cp.async, integer zero points folded for QuantLinear): the GPU tests of the
# kernels, the engine with CUDA graphs (greedy against the torch reference), QuantLinear and
# the fused split-K sum; then e2e decode at batch 1/4/16 against session 19's last commit
# (b6117f0, unpacked from old20.tar), interleaved new/old/new/old.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_cuda_graphs_gpu.py tests/test_quant_linear.py tests/test_splitk_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
decode_interleaved old20.tar
