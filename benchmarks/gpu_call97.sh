# Session 28 (written without a device; NOT run). RUN THIS FIRST: its change is on by default.
# The start-up's warm-up forwards run the model's first decoder layer only
# (CausalLM.first_layers): the kernel warm-up's ten prefills and each CUDA graph's eager run
# before its capture (13 decode + 7 prefill graphs), since every layer launches the same
# kernel variants. On the CPU stubs (benchmarks/host_forward.py) a 7B forward's host time
# falls from 12-17 ms to 0.5-0.7 ms; on the GPU host an eager 7B forward is ~45 ms of Python,
# so ~30 forwards should take ~1.3 s off a start. The kernel warm-up now also runs over the
# KV cache's own dtype (an fp8 cache's kernels).
# Here: the graph and warm-up GPU tests (graph replays equal eager forwards; nothing compiles
# while serving after a start, also one that reused its probes), then the start-up profile
# (session 27 call 3: kernel warm-up ~2.9 s, graph capture ~2.9 s, LLM() 8.3 s warm), which
# now also profiles the prefix scenario's cached first token.
set -u
source benchmarks/gpu_setup.sh > /dev/null 2>&1
unset PYTORCH_CUDA_ALLOC_CONF
(cd /tmp/checks && timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -s tests/test_prefill_graphs_gpu.py tests/test_cuda_graphs_gpu.py tests/test_warmup_gpu.py > $OUT/tests.log 2>&1; grep -E "graphs .* eager|passed|failed|Error" $OUT/tests.log | tail -8)
(cd /tmp && timeout 200 python3 $OLDPWD/benchmarks/profile_engine.py --out $OUT/prof --top 40 > $OUT/prof.log 2>&1; grep -E "warm-up|graph memory|KV cache:|CUDA graphs|Loaded|LLM construction|x prefill" $OUT/prof.log | sed 's/^.*INFO //' | cut -c1-170)
# the prefix scenario's cached first token (session 27: 7.1 ms, of which ~1.6 ms GPU): where
# the host time goes
grep -A 40 "cached + 24 new" $OUT/prof/profile_engine.txt | cut -c1-150
# (session 29) the same step's device time by kernel (torch.profiler, 5 requests)
grep -A 30 "under torch.profiler" $OUT/prof/profile_engine.txt | cut -c1-160
