#!/usr/bin/env bash
# Every GPU check that has not run on a GPU yet, in one device call (under 9 minutes):
#
#   run(command="bash benchmarks/gpu_checks.sh", carry=[".whl"], timeout_s=600)
#
# Needs the litestar wheels in .whl (notes/e2e_bench.md). Tests run from a copy outside the
# repository root: there ./edge_llm (without kernels/ and quant/) would shadow the installed
# package. Logs and JSON land in $OUT (at most 8 files come back).
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
ROOT=$(pwd)
source benchmarks/gpu_setup.sh

echo "== GPU tests" | tee "$OUT/tests.log"
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_kernels_fused_gpu.py tests/test_warmup_gpu.py tests/test_cuda_graphs_gpu.py \
    tests/test_fast_tokenizer.py $(ls tests/test_prefill_graphs_gpu.py 2>/dev/null) \
    >> "$OUT/tests.log" 2>&1)
tail -6 "$OUT/tests.log"

echo "== fused kernels vs torch ops"
timeout 60 python3 benchmarks/fused.py > "$OUT/fused.log" 2>&1; tail -12 "$OUT/fused.log"

echo "== decode with graphs and the fused kernels (session 9 without them: BENCHMARKS.md)"
EDGE_LLM_FUSED_KERNELS=1 timeout 120 python3 benchmarks/decode_graphs.py \
    --out "$OUT/decode_graphs_fused.json" 2>&1 | tail -6

echo "== cold start (7B AWQ, two starts, level-1 wake)"
cd "$ROOT" && timeout 140 python3 benchmarks/cold_start_gpu.py --out "$OUT" 2>&1 | tail -6
