# Session 25, call 2: call 1's 24 GB card run peaked 5 MB over the card (peak reserved +
# context); what serving adds to the allocator beyond the engine's plan, by allocating call
# (benchmarks/serving_memory.py at 0.18 of the H200, about a 24 GB card), then the e2e card
# scenario again.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
build_checkpoints $OUT/build.log awq
(cd /tmp && timeout 200 python3 $OLDPWD/benchmarks/serving_memory.py --ckpt /tmp/ck-awq --util 0.18 --out $OUT/sm > $OUT/serving_memory.log 2>&1; grep -v "INFO\|Loading" $OUT/serving_memory.log | tail -30)
(cd /tmp && timeout 150 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios card24 --out $OUT/e2e > $OUT/e2e.log 2>&1; grep "card" $OUT/e2e.log | cut -c1-160)
