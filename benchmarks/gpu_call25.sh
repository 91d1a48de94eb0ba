# Session 15, call 2: where the full offline scenario's time goes (3.87x transformers in
# call 1, 73 preemptions with a 40 GiB KV cache): offline_probe.py over KV sizes and token
# budgets on one engine, then the kernel tally of a decode step at 96 rows x 700 tokens.
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq
timeout 360 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 40,80,110 --batched 2048,8192 --out $OUT/probe.json > $OUT/probe.txt 2>&1
timeout 100 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 96 --prompt 700 --steps 8 --out $OUT/prof > $OUT/prof.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof.log | tail -12
grep -v "Warn\|Loading\|warn" $OUT/probe.txt | tail -9
