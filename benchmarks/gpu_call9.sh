# Written in session 11, NOT run there (its device time ran out): run it first next session,
# then gpu_call10.sh. It covers what session 11 changed after its last device call: split K
# summed in the kernel only at N <= 8,192 for 1-2 rows and up to 16 rows on the dot path, the
# sampler queued without a host sync (tests/test_sampler_gpu.py), the W4A16 references moved
# to kernels/w4a16_ref.py, and the loader converting one file at a time (staged reads).
set -u
source benchmarks/gpu_setup.sh
(cd /tmp/checks && timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampler_gpu.py tests/test_staged_read_gpu.py tests/test_splitk_gpu.py tests/test_kernels_gpu.py tests/test_warmup_gpu.py tests/test_fuse_gpu.py > $OUT/tests.log 2>&1); tail -3 $OUT/tests.log
timeout 170 python3 benchmarks/cold_start_gpu.py --out $OUT/cold 2>&1 | tail -6
