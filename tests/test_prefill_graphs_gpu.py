"""Short-step CUDA graphs on a CUDA GPU (``pytest -m gpu``).

Same random tiny models as tests/test_cuda_graphs_gpu.py (fp16 linears through cuBLAS, AWQ
through the W4A16 Triton kernels). Checks:

- the seven buckets (8..512 new tokens) are captured at start-up and reported; off with
  ``enforce_eager`` and in fp32;
- replay == the same padded forward run eagerly (bit for bit), and == the unpadded eager step
  within fp16 rounding (the linears' kernels depend on the row count), for one sequence and
  for several (prompts together; a prompt joining decoding sequences);
- greedy tokens with the graphs == ``enforce_eager`` (or the first difference at a near-tie),
  for prompts arriving one at a time, with and without prefix-cache hits, and for prompts
  arriving while others decode;
- sleep drops them, wake captures each on first use;
- time to first token of a 24-token tail after a cached 1,000-token prefix, and the step of
  a prompt joining 8 decoding sequences: graphs < eager.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm import SamplingParams  # noqa: E402
from edge_llm.engine.prefill_graphs import PREFILL_SIZES, is_short_step  # noqa: E402
from tests import test_cuda_graphs_gpu as decode_gpu  # noqa: E402
from tests.test_cuda_graphs import random_prompts, run_traffic, word_model  # noqa: E402

VOCAB = decode_gpu.VOCAB
make_llm = decode_gpu.make_llm
assert_same_or_near_tie = decode_gpu.assert_same_or_near_tie
# the decode tests' model fixtures (fp16 and AWQ), shared
fp16_dir, awq_dir, model_dir = decode_gpu.fp16_dir, decode_gpu.awq_dir, decode_gpu.model_dir

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=30, logprobs=2)


@pytest.fixture(autouse=True)
def free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def test_capture_is_reported_and_off_switches(fp16_dir):
    llm = make_llm(fp16_dir)
    pg = llm.engine.runner.prefill_graphs
    assert pg is not None and sorted(pg.graphs) == list(PREFILL_SIZES)
    st = llm.engine.stats()
    assert st["num_prefill_cuda_graphs"] == len(PREFILL_SIZES)
    assert st["num_cuda_graphs"] == 5 and st["cuda_graph_memory_bytes"] > 0
    del llm, pg
    gc.collect()
    for kw in ({"enforce_eager": True}, {"dtype": "float32"}):
        llm = make_llm(fp16_dir, **kw)
        assert llm.engine.runner.prefill_graphs is None, kw
        del llm
        gc.collect()


@pytest.mark.parametrize("n, start", [(2, 0), (24, 0), (24, 960), (33, 50), (64, 16), (65, 0),
                                      (100, 0), (129, 48), (300, 0), (300, 500), (512, 0)])
def test_replay_equals_padded_eager_and_unpadded_logits(model_dir, n, start):
    llm = make_llm(model_dir, enable_prefix_caching=True)
    engine, runner = llm.engine, llm.engine.runner
    prompt = random_prompts(1, VOCAB, start + n, start + n, seed=n + start)[0]
    if start:  # cache the prefix (full blocks of it) first
        llm.generate([{"prompt_token_ids": prompt[:start] + [3]}],
                     SamplingParams(max_tokens=1), use_tqdm=False)
    engine.add_request("x", {"prompt_token_ids": prompt}, GREEDY)
    sched = engine.scheduler.schedule()
    assert is_short_step(sched.scheduled), [s.num_scheduled_tokens for s in sched.scheduled]
    assert len(sched.scheduled) == 1
    s = sched.scheduled[0]
    assert s.start_pos == start - start % 16 or start == 0
    with torch.inference_mode():
        ids, pos, meta, _, _ = runner._prepare(sched.scheduled)
        eager = runner.model.compute_logits(runner.model(ids, pos, runner.kv.layers, meta))
    pg = runner.prefill_graphs
    before = sum(pg.replays.values())  # the prefix-filling request above may have replayed one
    _check_replay(pg, sched.scheduled, eager[-1:])  # the row the sampler reads
    assert sum(pg.replays.values()) - before == 2


def _check_replay(pg, scheduled, eager: torch.Tensor) -> None:
    """Replay ``scheduled``, then run the same padded forward with the graphs set aside:
    equal bit for bit, and within fp16 rounding of the unpadded ``eager`` rows."""
    replayed = pg.run(scheduled).clone()
    captured, pg.graphs = pg.graphs, {}
    try:
        padded = pg.run(scheduled).clone()
    finally:
        pg.graphs = captured
    assert torch.equal(replayed, padded)
    assert replayed.shape == eager.shape and torch.isfinite(replayed).all()
    err = float((replayed - eager).norm() / eager.norm())
    assert err < 1e-2, f"graph logits vs eager step: rel err {err:.2e}"


def _mixed_step(llm, prompts: list[list[int]], decoding: int):
    """``decoding`` requests decoding (prefilled, then stepped), the rest of ``prompts``
    added: the next step's SchedulerOutput (async outputs off: the scheduler is settled)."""
    engine = llm.engine
    for i, p in enumerate(prompts[:decoding]):
        engine.add_request(f"d{i}", {"prompt_token_ids": p}, GREEDY)
    for _ in range(3 if decoding else 0):
        engine.step()
    for i, p in enumerate(prompts[decoding:]):
        engine.add_request(f"p{i}", {"prompt_token_ids": p}, GREEDY)
    return engine.scheduler.schedule()


@pytest.mark.parametrize("decoding, new", [(3, 1), (0, 2), (5, 2)])
def test_replay_equals_padded_eager_several_sequences(model_dir, decoding, new):
    llm = make_llm(model_dir, disable_async_output_proc=True)
    runner = llm.engine.runner
    prompts = random_prompts(decoding + new, VOCAB, 20, 150, seed=10 * decoding + new)
    sched = _mixed_step(llm, prompts, decoding)
    counts = [s.num_scheduled_tokens for s in sched.scheduled]
    assert len(counts) == decoding + new and is_short_step(sched.scheduled), counts
    assert counts.count(1) == decoding, counts
    last = torch.tensor(counts, device="cuda").cumsum(0) - 1
    with torch.inference_mode():
        ids, pos, meta, _, _ = runner._prepare(sched.scheduled)
        hidden = runner.model(ids, pos, runner.kv.layers, meta)
        eager = runner.model.compute_logits(hidden[last])
    _check_replay(runner.prefill_graphs, sched.scheduled, eager)


def test_greedy_equals_enforce_eager_prompts_joining_decodes(model_dir):
    """Prompts of 2..300 tokens arriving 3 steps apart, most of them while others decode:
    their prefill steps carry decode rows (mixed steps) or other prompts."""
    prompts = random_prompts(12, VOCAB, 2, 300, seed=8)
    arrivals = [(3 * i, p) for i, p in enumerate(prompts)] + [(20, prompts[0][:40])]
    ref = run_traffic(make_llm(model_dir, enforce_eager=True), arrivals, GREEDY)
    llm = make_llm(model_dir)
    pg = llm.engine.runner.prefill_graphs
    widths, run = [], pg.run

    def recording_run(scheduled):
        widths.append(len(scheduled))
        return run(scheduled)

    pg.run = recording_run
    got = run_traffic(llm, arrivals, GREEDY)
    keys = sorted(ref)
    assert keys == sorted(got) and len(keys) == len(arrivals)
    assert_same_or_near_tie([ref[k] for k in keys], [got[k] for k in keys])
    assert sum(w > 1 for w in widths) >= 8, widths  # steps of several sequences replayed
    llm.engine.check_integrity()


def test_greedy_equals_enforce_eager(model_dir):
    """Prompts of 2..400 new tokens arriving alone (so their prefill is a one-sequence step),
    half of them sharing a 48-token prefix (prefix-cache hits leave short tails)."""
    shared = random_prompts(1, VOCAB, 48, 48, seed=1)[0]
    tails = random_prompts(10, VOCAB, 2, 400, seed=2)
    prompts = [t if i % 2 else shared + t[:16] for i, t in enumerate(tails)]
    arrivals = [(40 * i, p) for i, p in enumerate(prompts)]
    ref = run_traffic(make_llm(model_dir, enforce_eager=True, enable_prefix_caching=True),
                      arrivals, GREEDY)
    llm = make_llm(model_dir, enable_prefix_caching=True)
    got = run_traffic(llm, arrivals, GREEDY)
    keys = sorted(ref)
    assert keys == sorted(got) and len(keys) == len(prompts)
    assert_same_or_near_tie([ref[k] for k in keys], [got[k] for k in keys])
    replays = llm.engine.runner.prefill_graphs.replays
    assert sum(replays.values()) >= 8 and len(replays) >= 2, replays
    llm.engine.check_integrity()


def test_sleep_drops_and_wake_captures_on_first_use(fp16_dir):
    llm = make_llm(fp16_dir)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(1, VOCAB, 20, 20, seed=3)]
    before = llm.generate(prompts, GREEDY, use_tqdm=False)
    llm.engine.sleep(1)
    assert llm.engine.runner.prefill_graphs is None
    assert llm.engine.stats()["num_prefill_cuda_graphs"] == 0
    llm.engine.wake_up()
    pg = llm.engine.runner.prefill_graphs
    assert pg is not None and pg.graphs == {}
    after = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
    assert sorted(pg.graphs) == [32] and pg.replays[32] == 1


def _graphs_vs_eager(runner, work, what: str) -> dict[str, float]:
    """Median of 7 timed ``work()`` calls (device synchronised) with the short-step graphs
    on, then detached (eager), twice over (the later run of each mode kept), after one warm
    call each time; printed with ``what``."""
    def timed() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        work()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    pg, results = runner.prefill_graphs, {}
    try:
        for mode in ("graphs", "eager", "graphs", "eager"):
            runner.prefill_graphs = pg if mode == "graphs" else None
            timed()  # warm
            results[mode] = statistics.median(timed() for _ in range(7))
    finally:
        runner.prefill_graphs = pg
    print(f"{what}: graphs {results['graphs'] * 1e3:.2f} ms, eager "
          f"{results['eager'] * 1e3:.2f} ms ({results['eager'] / results['graphs']:.2f}x)")
    return results


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory) -> Path:
    """16 layers: launch overhead dominates as in a 7B model's 32 (a tiny model's kernels
    are all launch-bound)."""
    return word_model(tmp_path_factory.mktemp("prefill-deep"), vocab=VOCAB, logit_scale=20.0,
                      hidden=256, heads=4, kv_heads=2, layers=16, max_pos=2048)


def test_prefix_cache_ttft_graphs_faster(deep_dir):
    """One 24-token prefill after a cached 1,000-token prefix, median of 7, each with a fresh
    tail: prefill graphs on vs the same engine with them detached (eager)."""
    llm = make_llm(deep_dir, max_model_len=2048, enable_prefix_caching=True,
                   max_num_batched_tokens=2048)
    runner = llm.engine.runner
    prefix = random_prompts(1, VOCAB, 1000, 1000, seed=4)[0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prefix}], one, use_tqdm=False)  # cache it
    tails = iter(random_prompts(40, VOCAB, 24, 24, seed=5))
    pg = runner.prefill_graphs

    def first_token() -> None:  # 992 = 62 full blocks of the cached prefix, a fresh tail
        llm.generate([{"prompt_token_ids": prefix[:992] + next(tails)}], one, use_tqdm=False)

    results = _graphs_vs_eager(runner, first_token,
                               "TTFT 24 tokens after a cached 1,000-token prefix")
    assert pg.replays[32] >= 16
    assert results["graphs"] < results["eager"]


def test_prompt_joining_decodes_graphs_faster(deep_dir):
    """The step of a 200-token prompt joining 8 decoding sequences (what stalls their next
    token), median of 7 runs of that step: short-step graphs on vs detached (eager)."""
    llm = make_llm(deep_dir, max_model_len=2048, max_num_batched_tokens=2048,
                   disable_async_output_proc=True)
    runner = llm.engine.runner
    sched = _mixed_step(llm, random_prompts(9, VOCAB, 200, 200, seed=6), 8)
    assert sorted(s.num_scheduled_tokens for s in sched.scheduled) == [1] * 8 + [200]
    pg = runner.prefill_graphs

    # the same step again each time: it rewrites the same K/V slots
    results = _graphs_vs_eager(runner, lambda: runner.execute(sched),
                               "a 200-token prompt joining 8 decoding sequences")
    assert pg.replays[256] >= 16
    assert results["graphs"] < results["eager"]
