# Session 24, last call: the final code end to end in one run (decode, offline and
# transformers' static batch of 64, so the offline ratio has its baseline from the same
# process), then the W4A16 GPU tests (kernels/w4a16_dot.py split out of w4a16.py).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp && timeout 330 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,baseline --baseline-batches 64 --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (decode|offline|baseline|transformers)" $OUT/e2e.log | cut -c1-220
sed -n '/headline/,$p' $OUT/e2e.log | head -20
(cd /tmp/checks && timeout 140 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k "w4a16" 2>&1 | tail -2)
