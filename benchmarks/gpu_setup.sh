# Sourced by the benchmarks/gpu_*.sh device scripts: litestar wheels from .whl (carry them),
# this checkout installed, and a copy of tests/ and benchmarks/ in /tmp/checks to run GPU
# tests from (./edge_llm in the repository root would shadow the installed package).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation . || exit 1
export OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
rm -rf /tmp/checks && mkdir -p /tmp/checks && cp -r tests benchmarks /tmp/checks/
# build_checkpoints LOG FORMAT...: random Llama-2-7B g128 checkpoints in /tmp/ck-FORMAT, built
# in one process (benchmarks/random_checkpoint.py); the log's tail is shown on failure.
# CK_SHAPE=qwen2.5-7b (any random_checkpoint shape) builds that shape instead, in the same
# folders.
build_checkpoints() {
  local log=$1; shift
  CK_SHAPE=${CK_SHAPE:-llama2-7b} python3 - "$@" > "$log" 2>&1 <<'PY' || tail -5 "$log"
import os, sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from random_checkpoint import make_random_checkpoint
for f in sys.argv[1:]:
    make_random_checkpoint(os.environ['CK_SHAPE'], f, Path('/tmp/ck-' + f), 128, 'cuda')
PY
}
# decode_interleaved TAR: e2e decode at batch 1/4/16 of this checkout against an older commit
# (`git archive` into TAR, installed aside; /old*.tar is git-ignored, so name it in the run
# call's carry), interleaved new/old/new/old; logs under $OUT.
decode_interleaved() {
  rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf "$1" -C /tmp/old
  python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/oldsite /tmp/old > /dev/null 2>&1 || echo "old install failed"
  local run pp b
  for run in new1 old1 new2 old2; do
    if [[ $run == old* ]]; then pp=/tmp/oldsite:$PYTHONPATH; b=/tmp/old/benchmarks; else pp=$PYTHONPATH; b=$PWD/benchmarks; fi
    (cd /tmp && PYTHONPATH=$pp timeout 100 python3 $b/e2e.py --shapes llama2-7b --scenarios decode --out $OUT/$run > $OUT/$run.log 2>&1)
    echo "$run $(grep -E 'decode b' $OUT/$run.log | grep INFO | sed 's/.*decode/decode/' | tr '\n' ' ')"
  done
}
# decode_switch VAR BATCHES [ON]: e2e decode at BATCHES (comma-separated) of this checkout
# with the environment switch VAR=0 / ON / 0 / ON (ON defaults to 1; runs off1, on1, off2,
# on2, logs under $OUT, or under $OUT/$TAG when TAG is set).
decode_switch() {
  local var=$1 batches=$2 on=${3:-1} run v dir=$OUT${TAG:+/$TAG}
  mkdir -p $dir
  for run in off1 on1 off2 on2; do
    v=0; [[ $run == on* ]] && v=$on
    (cd /tmp && env "$var=$v" timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios decode --decode-batches "$batches" --out $dir/$run > $dir/$run.log 2>&1)
    echo "$run $(grep -E 'decode b' $dir/$run.log | grep INFO | sed 's/.*decode b/b/; s/ tok.s.*step/ step/' | tr '\n' ' ')"
  done
}
# prefix_switch VAR: e2e's prefix scenario (cached first token, prefix caching on / off) of
# this checkout with the environment switch VAR=0 / 1 / 0 / 1 (runs poff1, pon1, poff2,
# pon2, logs under $OUT).
prefix_switch() {
  local var=$1 run v
  for run in off1 on1 off2 on2; do
    v=1; [[ $run == off* ]] && v=0
    (cd /tmp && env "$var=$v" timeout 100 python3 $OLDPWD/benchmarks/e2e.py --shapes llama2-7b --scenarios prefix --out $OUT/p$run > $OUT/p$run.log 2>&1)
    echo "$var $run $(grep -E 'INFO e2e: prefix' $OUT/p$run.log | sed 's/^.*INFO e2e: //' | cut -c1-120)"
  done
}
# ttft_switch VAR CKPT LENGTHS: benchmarks/ttft.py (fresh prompts' first token, prefill
# graphs and eager) on checkpoint CKPT at LENGTHS with VAR=0 / 1 / 0 / 1 (logs under $OUT).
ttft_switch() {
  local var=$1 ckpt=$2 lengths=$3 run v
  for run in off1 on1 off2 on2; do
    v=1; [[ $run == off* ]] && v=0
    (cd /tmp && env "$var=$v" timeout 110 python3 $OLDPWD/benchmarks/ttft.py --ckpt $ckpt --lengths $lengths --trials 9 --out $OUT/ttft_$run.json > $OUT/ttft_$run.log 2>&1)
    echo "$var $run"; grep -E "^ +[0-9]+ \||Error|error" $OUT/ttft_$run.log | cut -c1-120
  done
}
