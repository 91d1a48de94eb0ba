# Written at the end of session 24, NOT run there (device time spent): the GPU checks of what
# changed after its last device call. (1) The decode and prefill graph sets' shared capture
# accounting and release (capture_stats / release_graphs): the graph tests, which capture,
# replay, release and recapture. (2) test_kernels_gpu.py -k w4a16 in full (call 9 ran 36 of
# its tests before the call's time limit, after kernels/w4a16_dot.py was split out).
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_graphs_gpu.py tests/test_prefill_graphs_gpu.py tests/test_warmup_gpu.py 2>&1 | tail -2)
(cd /tmp/checks && timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_gpu.py -k w4a16 2>&1 | tail -2)
