# Session 16, call 2: the fp8 KV cache with the hardware e4m3 conversion (sm_89+): its GPU
# tests (both decodings), the decode attention probe (benchmarks/decode_probe.py: launch
# variants x fp16 / fp8-int / fp8-cvt storage, incl. the offline run's 160 x 800 MHA steps),
# then #7's offline scenario with the fp8 cache and with fp16 (transformers' baseline of
# this session: call 1, 678 tok/s at batch 64).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kv_fp8_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
timeout 200 python3 benchmarks/decode_probe.py --out $OUT/probe.json > $OUT/probe.txt 2>&1; grep -v Warn $OUT/probe.txt | grep "|\|Error"
for kv in fp8 auto; do
timeout 110 python3 benchmarks/e2e.py --shapes llama2-7b --scenarios offline --kv-cache-dtype $kv --out $OUT/e2e-$kv > $OUT/e2e-$kv.txt 2>&1; grep "offline:\|KV cache:" $OUT/e2e-$kv.txt
done
grep -E "FAILED|Error" $OUT/tests.log | head -8
