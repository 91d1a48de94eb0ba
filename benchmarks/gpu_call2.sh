set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs_gpu.py tests/test_kernels_fused_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 200 python3 benchmarks/profile_kernels.py --batches 1,16,64 --prompt 512 --out $OUT > $OUT/profile.log 2>&1; cat $OUT/profile.log | grep -v Warning | tail -60
for pg in 0 1; do EDGE_LLM_PREFILL_GRAPHS=$pg timeout 100 python3 benchmarks/e2e.py --quick --scenarios prefix --out $OUT/prefix$pg > $OUT/prefix$pg.log 2>&1; grep -i "prefix:" $OUT/prefix$pg.log | tail -2; done
timeout 150 python3 benchmarks/cold_start_gpu.py --out $OUT/cold 2>&1 | tail -5
