# Written in session 11, NOT run there: the full quick end-to-end run (#7) with the final
# kernel choice and act-order checkpoints whose q/k/v and gate/up share a column order.
set -u
source benchmarks/gpu_setup.sh
timeout 300 python3 benchmarks/e2e.py --quick --budget-s 250 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | grep -A20 "headline"
