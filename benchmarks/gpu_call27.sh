# Written in session 15, NOT run there (device time spent): where a large-batch decode step
# goes (the offline scenario's decode-only steps move 193 us per output token at 158 rows,
# where the KV reads alone need 91 us): kernel tally at 64 / 128 / 160 rows x 800 tokens,
# with a KV cache that holds them all (no preemption inside the difference).
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq
timeout 300 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 64,128,160 --prompt 800 --steps 8 --kv-gib 72 --out $OUT/prof > $OUT/prof.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof.log | tail -48
# and the swap copies as rewritten in session 15 (runs of slots straight into the pinned swap
# space, no host staging or sync) against recompute, under memory pressure (no reserve)
timeout 120 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 40 --batched 8192 --reserves 0 --modes swap,recompute --out $OUT/probe.json > $OUT/probe.txt 2>&1; grep -v "Warn\|Loading\|warn" $OUT/probe.txt | grep "|"
