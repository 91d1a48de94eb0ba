# Session 12, call 4: AWQ vs GPTQ vs act-order GPTQ decode, interleaved (the e2e run's formats
# scenario measured them once each, in that order), with CUDA graphs. (The kernel tallies of
# AWQ vs act-order were cut: the device time left did not cover them.)
set -u
source benchmarks/gpu_setup.sh
build_checkpoints $OUT/build.log awq gptq gptq-act
for round in 1 2; do for f in awq gptq gptq-act; do
  timeout 90 python3 benchmarks/decode_graphs.py --graphs-only --reps 3 --ckpt /tmp/ck-$f --out $OUT/dg-$f-$round.json 2>&1 | grep -A3 "batch" | tail -3 | sed "s/^/$f r$round /"
done; done
