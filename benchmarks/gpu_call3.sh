# session 10, device call 3: merged projections on the GPU (tests, decode speed, kernel profile)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation . || exit 1
export OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
rm -rf /tmp/checks && mkdir -p /tmp/checks && cp -r tests benchmarks /tmp/checks/
(cd /tmp/checks && timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fuse_gpu.py tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_kernels_fused_gpu.py tests/test_kernels_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 120 python3 benchmarks/decode_graphs.py --out $OUT/decode_graphs.json 2>&1 | tail -5
timeout 150 python3 benchmarks/profile_kernels.py --batches 1,16 --prompt 128 --out $OUT > $OUT/profile.log 2>&1; grep -v Warn $OUT/profile.log | grep -A12 "^batch"
