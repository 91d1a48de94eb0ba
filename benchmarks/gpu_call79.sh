# Written at the end of session 24, NOT run there (device time spent). Two parts:
# `bash benchmarks/gpu_call79.sh`: the GPU checks of what changed after session 24's last
# device call: (1) the decode and prefill graph sets' shared capture accounting and release
# (capture_stats / release_graphs): the graph tests, which capture, replay, release and
# recapture; (2) test_kernels_gpu.py -k w4a16 in full (call 9 ran 36 of its tests before the
# call's time limit, after kernels/w4a16_dot.py was split out).
# `bash benchmarks/gpu_call79.sh e2e`: #7's points last measured sessions ago, on the current
# code in one process (generation at 64 sequences against llama.cpp, prefix caching, the
# 24 GB card, AWQ / GPTQ / act-order GPTQ).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
if [[ ${1:-tests} == e2e ]]; then
  (cd /tmp && timeout 560 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios gen64,prefix,card24,formats --out $OUT/e2e > $OUT/e2e.log 2>&1)
  sed -n '/headline/,$p' $OUT/e2e.log | head -30
  exit 0
fi
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py 2>&1 | tail -2)
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k w4a16 2>&1 | tail -2)
