# Session 13, call 5: end to end with the swap dispatch, the in-kernel decode split sums and
# the act-order changes (decode fraction of the floor, offline vs transformers); then the
# merged-vs-unmerged greedy test with the near-tie bound at one fp16 logit step.
set -u
source benchmarks/gpu_setup.sh
timeout 170 python3 benchmarks/e2e.py --quick --scenarios decode,offline,baseline --budget-s 150 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A14 "headline"
(cd /tmp/checks && timeout 40 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py 2>&1 | tail -2)
