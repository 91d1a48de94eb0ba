# Session 30. Prefill attention with its keys split per q tile (kernels/paged_prefill.py
# SPLIT, planned like decode's context split when q tiles x kv heads are too few programs;
# a second launch merges the partitions). Session 30's profile: 24 cached-prefix queries
# over 1,000 keys took 1.52 ms of attention per 7B forward, 0.12 ms at copy bandwidth.
# Here: the attention GPU tests and the warm-up test (nothing compiles while serving: the
# warm-up now runs a split prefill too), then benchmarks/prefill_split.py (one partition
# against the planned split, Llama-2 and Qwen2.5 heads, 8-512 new tokens over 1,000 and
# 4,000 keys).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; tail -1 $OUT/tests.log; grep -E "^FAILED|Error" $OUT/tests.log | head -5)
(cd /tmp && timeout 150 python3 $OLDPWD/benchmarks/prefill_split.py 2>&1 | tee $OUT/prefill_split.log)
