# Session 23, call 3: plane-packed words. (1) GPU tests: the kernels at full size on both MMA
# kinds, QuantLinear's CUDA forward packed and not, the engine with graphs (greedy against
# the torch reference; the loader packs by default). (2) gemv_sweep: the dispatch on standard
# words against plane-packed words at 1-128 rows, and the plane-packed tiles at 3-64.
# (3) e2e decode b1/b4/b16 against the commit before (fused split K at 1-2 rows included in
# both), interleaved; carry old23.tar.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py tests/test_quant_linear.py tests/test_cuda_graphs_gpu.py -k "plane or one_row or gemv16 or mma_sync or cuda_forward or graph or greedy or engine" > $OUT/tests.log 2>&1); tail -1 $OUT/tests.log
grep -E "^FAILED|^ERROR|^E  " $OUT/tests.log | head -12
M=1,2,4,8,16,24,32,48,64,128
timeout 150 python3 benchmarks/gemv_sweep.py --ms $M --only none --out $OUT/std > $OUT/std.log 2>&1
timeout 200 python3 benchmarks/gemv_sweep.py --ms $M --planes --out $OUT/planes > $OUT/planes.log 2>&1
grep -E "^M=" $OUT/std.log | cut -c1-60
grep -E "^M=" $OUT/planes.log | cut -c1-230
decode_interleaved old23.tar
