# session 11, device call 5: the full end-to-end run with the final kernel choice (split K
# summed in the kernel only at N <= 8,192 for 1-2 rows and at 3-16 rows) and act-order
# checkpoints whose q/k/v and gate/up share a column order (so they merge)
set -u
source benchmarks/gpu_setup.sh
timeout 190 python3 benchmarks/e2e.py --quick --budget-s 140 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep -v "Warn\|Loading" $OUT/e2e.log | grep -A20 "headline"
