# Session 16, call 4: the final kernels. GPU tests (decode with the register cap, the fp8
# cache with both decodings, CUDA graphs against eager), the attention table of
# benchmarks/kernels.py, then #7's decode and offline scenarios with the fp16 and the fp8
# cache (transformers' baseline of this session: call 1, 678 tok/s at batch 64).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_kv_fp8_gpu.py tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
timeout 80 python3 benchmarks/kernels.py --quick --skip-w4 > $OUT/kq.txt 2>&1; grep "sdpa\|fp8 KV" $OUT/kq.txt | grep -v "DecodeConfig(block_n=64, num_splits=[24]"
for kv in auto fp8; do
timeout 100 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios decode,offline --kv-cache-dtype $kv --out $OUT/e2e-$kv > $OUT/e2e-$kv.txt 2>&1; grep "offline:\|decode b" $OUT/e2e-$kv.txt | grep -v "|"
done
grep -E "FAILED|Error" $OUT/tests.log | head -8
