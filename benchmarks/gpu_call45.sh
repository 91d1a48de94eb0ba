# After gpu_call44.sh: the best 1-row variant of its sweep against the dispatched choice in
# the engine (decode with CUDA graphs at batch 1, 4, 16; pick_config patched at 1-2 rows only),
# alternating processes, two rounds. Needs the sweep's JSON at $SWEEP.
set -u
SWEEP=${SWEEP:-notes/run19_call1/sweep/gemv_sweep.json}
source benchmarks/gpu_setup.sh > /dev/null 2>&1
build_checkpoints $OUT/build.log awq
timeout 500 python3 benchmarks/decode_graphs.py --ckpt /tmp/ck-awq --graphs-only --variant best:$SWEEP --rounds 2 --out $OUT/variant.json > $OUT/variant.txt 2>&1
cat $OUT/variant.txt | tail -8
