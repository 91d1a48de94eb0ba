# Written in session 15, NOT run there (device time spent): the fp8 KV cache on the GPU. Its
# GPU tests (writes bit for bit, decode/prefill attention over uint8 caches, graphs = eager),
# then #7's decode, offline (256 requests) and 24 GB card scenarios with --kv-cache-dtype fp8
# against transformers' static batch of 64, in one run; before them, decode attention over
# fp8 codes against the fp16 cache (benchmarks/kernels.py --quick --skip-w4).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kv_fp8_gpu.py tests/test_kv_cache_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1)
timeout 90 python3 benchmarks/kernels.py --quick --skip-w4 > $OUT/kq.txt 2>&1; grep "fp8 KV" $OUT/kq.txt
timeout 280 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline,card24,baseline --baseline-batches 64 --kv-cache-dtype fp8 --budget-s 270 --out $OUT/e2e-fp8 > $OUT/e2e.txt 2>&1; grep -v "Warn\|Loading" $OUT/e2e.txt | grep -A12 "headline"
grep -E "FAILED|Error" $OUT/tests.log | head -8; tail -2 $OUT/tests.log
