# Session 22, call 2: (1) mma.sync (DISABLE_MMA_V3=1): the plane dots over x in plane order
# against the "dot" kernel at 24-64 rows; (2) decode attention at the e2e decode scenario's
# short contexts with the graphs' split grid (max_seq_len 4,096): launch variants; (3) the
# host cost of a decode step's input copies.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
DISABLE_MMA_V3=1 timeout 240 python3 benchmarks/gemv_sweep.py --ms 24,32,48,64 --only planes,dot --out $OUT/mma_sync > $OUT/mma_sync.txt 2>&1; head -n 5 $OUT/mma_sync.txt | cut -c1-700
grep FAILED $OUT/mma_sync/gemv_sweep.log | head -3
timeout 150 python3 benchmarks/decode_probe.py --cases 6,7,8 --fp8 0 --max-len 4096 --out $OUT/decode_probe.json > $OUT/decode_probe.txt 2>&1; cut -d'|' -f1-6 $OUT/decode_probe.txt | head -60
timeout 90 python3 benchmarks/input_copies.py > $OUT/input_copies.txt 2>&1; cat $OUT/input_copies.txt | tail -8
