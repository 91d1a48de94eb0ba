# Session 15, call 3: the growth reserve (SchedulerConfig.growth_reserve) and the swap space
# under memory pressure (offline_probe.py at a 40 GiB cache, 8,192-token budget), then #7's
# full offline scenario with the new defaults (the engine's own KV sizing, LLM's 8,192-token
# budget, reserve 256) against transformers' static batches of 64 and 128.
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq
timeout 150 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 40 --batched 8192 --reserves 0,128,256 --swap 1 --out $OUT/probe1.json > $OUT/probe1.txt 2>&1
timeout 70 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 40 --batched 8192 --reserves 0 --swap 0 --out $OUT/probe2.json > $OUT/probe2.txt 2>&1
timeout 330 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios offline,baseline --baseline-batches 64,128 --budget-s 320 --out $OUT/e2e > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A5 "headline"; grep -i "offline:\|static batch\|KV cache:" $OUT/e2e.txt | tail -4
grep -hv "Warn\|Loading\|warn" $OUT/probe1.txt $OUT/probe2.txt | grep "|"
