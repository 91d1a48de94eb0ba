# Session 25, call 1: (1) the GPU checks of what changed after session 24's last device call
# (the decode and prefill graph sets' shared capture accounting and release: capture_stats /
# release_graphs); (2) #7's points last measured sessions ago, on the current code in one
# process (generation at 64 sequences against llama.cpp, prefix caching, the 24 GB card, AWQ /
# GPTQ / act-order GPTQ); (3) where the offline scenario's time goes now (decode-only against
# mixed steps), on the e2e run's AWQ checkpoint with the engine's own cache size.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log)
(cd /tmp && timeout 260 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios gen64,prefix,card24,formats --out $OUT/e2e > $OUT/e2e.log 2>&1)
grep -E "INFO e2e: (gen|prefix|card|format|awq|gptq)" $OUT/e2e.log | cut -c1-200
sed -n '/headline/,$p' $OUT/e2e.log | head -30
(cd /tmp && timeout 100 python3 $OLDPWD/benchmarks/offline_probe.py --ckpt /tmp/edge-llm-bench/llama2-7b-awq-g128 --kv-gib 120 --batched 8192 --reserves 128 --out $OUT/offline_probe.json > $OUT/offline_probe.log 2>&1; tail -3 $OUT/offline_probe.log)
