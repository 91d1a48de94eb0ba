# Session 18, call 7: sleep drops the reused dequantization buffer and wake restores it at its
# size before the graphs are captured. GPU tests of the graph paths, sleep/wake included.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_kv_cache_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
