# Session 16, call 5: where a large-batch decode step goes, measured on the decode steps
# themselves (profile_kernels.py now prefills first, then tallies / times decode-only steps;
# call 3's difference of two runs held a prefill step): 64 and 160 rows x 800 tokens.
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq
timeout 150 python3 benchmarks/profile_kernels.py --ckpt /tmp/ck-awq --batches 160 --prompt 800 --steps 8 --kv-gib 100 --out $OUT/prof > $OUT/prof.log 2>&1; grep -v "Warn\|INFO\|Loading\|warn" $OUT/prof.log | tail -34
