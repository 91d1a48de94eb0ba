# Session 27 (written without a device; NOT run). silu(gate) * up in the one-row GEMV's
# epilogue (EDGE_LLM_GEMV_SILU=1, kernels/w4a16_gemv.py SILU): one kernel fewer per layer
# at decode batch 1-2 (the gate/up GEMV runs in one split at 7B sizes). Compiled for sm_86 /
# 89 / 90 on the CPU: the same 16-byte cp.async loads and word unpacking as the plain GEMV
# (tests/test_kernels_compile.py), bit-equal to the two-kernel path in the interpreter.
# Here: the GPU tests (fused against two kernels per layer, greedy engine equality), then
# decode at batch 1 / 2 / 4 with it off / on / off / on. If it wins, the default flips.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_gemv_silu_gpu.py > $OUT/tests.log 2>&1; grep -E "bit-equal|passed|failed|Error" $OUT/tests.log | tail -6)
decode_switch EDGE_LLM_GEMV_SILU 1,2,4
