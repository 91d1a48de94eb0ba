# Session 12, call 3: decode with CUDA graphs and the quick end-to-end run (#7) with the new
# W4A16 dispatch and the act-order gathers folded into the norms and gate/up columns.
set -u
source benchmarks/gpu_setup.sh
timeout 100 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -6
timeout 330 python3 benchmarks/e2e.py --quick --budget-s 250 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | grep -A24 "headline"
