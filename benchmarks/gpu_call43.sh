# Session 18, call 8: the offline workload (256 requests) with three decode graph ladders:
# the default 13 sizes, + 160 and 224, and steps of 8-16 rows (23 sizes). Replays per size
# are in the JSON.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
build_checkpoints $OUT/build.log awq
M=1,2,4,8,16,24,32,48,64,96,128,160,192,224,256
F=1,2,4,8,16,24,32,40,48,56,64,80,96,112,128,144,160,176,192,208,224,240,256
for run in default medium fine; do
  case $run in default) s="";; medium) s="--cuda-graph-sizes $M";; fine) s="--cuda-graph-sizes $F";; esac
  timeout 80 python3 benchmarks/offline_probe.py --ckpt /tmp/ck-awq --kv-gib 100 --batched 8192 $s --out $OUT/$run.json > $OUT/$run.log 2>&1
  echo "$run $(grep -E '^ *100' $OUT/$run.log) $(grep -E 'decode graphs' $OUT/$run.log | sed 's/.*CUDA graphs: //')"
done
