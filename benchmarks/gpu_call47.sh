# Session 20, call 3: around call 2's best one-row tile (64 columns, K tiles of one group,
# flat scales, folded zero points, loads staged 4 tiles ahead): stages, tile, waves, warps;
# then the best one-row variant against the dispatched GEMV in the engine (decode with CUDA
# graphs at batch 1, 4, 16; pick_config patched at 1-2 rows), alternating processes.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
timeout 200 python3 benchmarks/gemv_sweep.py --ms 1,2 --out $OUT/sweep > $OUT/sweep.txt 2>&1; head -n 3 $OUT/sweep.txt | cut -c1-900
grep -A16 "best variant" $OUT/sweep.txt | head -17; grep FAILED $OUT/sweep/gemv_sweep.log | head -3
build_checkpoints $OUT/build.log awq
timeout 330 python3 benchmarks/decode_graphs.py --ckpt /tmp/ck-awq --graphs-only --variant best:$OUT/sweep/gemv_sweep.json --rounds 2 --out $OUT/variant.json > $OUT/variant.txt 2>&1
tail -8 $OUT/variant.txt
