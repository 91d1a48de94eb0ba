# Session 25, last call: the final code (expandable segments, prefill graphs to 512 tokens,
# 128 MiB serving slack) end to end: decode, offline, the 24 GB card; then issue #6's cold
# start (three serve starts, sleep / wake) with the new start-up work (3 more prefill graphs,
# KV mapped through expandable segments).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp && timeout 220 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,card24 --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (decode|offline|24 GB|llama2-7b / load)|prefill graphs|graph memory|KV cache:" $OUT/e2e.log | cut -c1-200
sed -n '/headline/,$p' $OUT/e2e.log | head -14
(cd /tmp && timeout 320 python3 $OLDPWD/benchmarks/cold_start_gpu.py --out $OUT/cold > $OUT/cold.log 2>&1; tail -22 $OUT/cold.log)
