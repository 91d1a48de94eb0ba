# Session 16, call 3: the decode kernel's launch variants with and without the 128-register cap (why the in-kernel
# split sum lost 30% at 32 x 2,048 GQA 4), then gpu_call27.sh (session 15, not run there):
# the kernel tally of a large-batch decode step, and swap against recompute.
set -u
source benchmarks/gpu_setup.sh
timeout 100 python3 benchmarks/decode_probe.py --cases 0,1,2,5 --fp8 0 --out $OUT/dprobe.json > $OUT/dprobe.txt 2>&1; grep -v Warn $OUT/dprobe.txt | grep "|\|Error"
build_checkpoints $OUT/build.log awq
timeout 260 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 64,160 --prompt 800 --steps 8 --kv-gib 72 --out $OUT/prof > $OUT/prof.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof.log | tail -40
timeout 120 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 40 --batched 8192 --reserves 0 --modes swap,recompute --out $OUT/probe.json > $OUT/probe.txt 2>&1; grep -v "Warn\|Loading\|warn" $OUT/probe.txt | grep "|"
