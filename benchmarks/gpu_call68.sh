# Session 22, call 7: decode run-ahead on the GPU: the CUDA-graph engine tests (the new
# run-ahead test: tokens bit for bit against async outputs alone), then e2e decode at batch
# 1 / 4 / 16 against 722d37c (the commit before it; old22.tar, carried), interleaved.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
decode_interleaved old22.tar
grep -h "run-ahead\|ahead" $OUT/new1.log | head -3
