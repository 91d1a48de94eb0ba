"""The engine end to end on CPU: batching, preemption, prefix caching, sampling options."""

from __future__ import annotations

import random

import pytest

from edge_llm import LLM, SamplingParams
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 60) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(rng.randint(lo, hi))]}
            for _ in range(n)]


def _texts(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def _assert_idle(llm: LLM) -> None:
    sched = llm.engine.scheduler
    sched.check_integrity()
    assert not sched.has_unfinished()
    st = llm.engine.stats()
    assert st["num_free_blocks"] == st["num_total_blocks"]


@pytest.fixture(scope="module")
def tiny_llm(tiny_dir):  # noqa: F811
    return LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16)


def test_batched_equals_alone(tiny_llm):
    prompts = _prompts(16)
    params = SamplingParams(max_tokens=12, **GREEDY)
    together = tiny_llm.generate(prompts, params, use_tqdm=False)
    alone = [tiny_llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    assert _texts(together) == _texts(alone)
    assert all(len(o.outputs[0].token_ids) == 12 for o in together)
    assert all(o.outputs[0].finish_reason == "length" for o in together)
    _assert_idle(tiny_llm)


@pytest.mark.parametrize("swap_space,mode", [(1.0, "swap"), (1.0, None), (0.0, "swap")],
                         ids=["swap", "default", "no-swap-space"])
def test_preemption_gives_identical_outputs(tiny_dir, tiny_llm, swap_space, mode):  # noqa: F811
    prompts = _prompts(10, seed=3, lo=10, hi=40)
    params = SamplingParams(max_tokens=30, **GREEDY)
    ref = tiny_llm.generate(prompts, params, use_tqdm=False)
    small = LLM(str(tiny_dir), device="cpu", block_size=8, num_gpu_blocks_override=24,
                swap_space=swap_space, max_num_batched_tokens=128, max_num_seqs=16,
                max_model_len=160, growth_reserve=0, preemption_mode=mode)
    outs = small.generate(prompts, params, use_tqdm=False)
    assert _texts(outs) == _texts(ref)
    assert small.engine.scheduler.stats()["num_preemptions"] > 0
    _assert_idle(small)


def test_steps_with_decodes_capped_give_the_same_outputs(tiny_dir, tiny_llm,  # noqa: F811
                                                        monkeypatch):
    """``max_tokens_with_decodes``: "auto" is no cap without short-step CUDA graphs (CPU);
    with graphs of up to 48 tokens (stood in for) every step that decodes stays within 48
    tokens, prompts joining in chunks, and greedy outputs equal the uncapped engine's."""
    from edge_llm.engine.runner import ModelRunner

    prompts = _prompts(12, seed=5, lo=20, hi=90)
    params = SamplingParams(max_tokens=10, **GREEDY)
    auto = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256,
               max_tokens_with_decodes="auto")
    assert auto.engine.config.scheduler.max_tokens_with_decodes is None
    monkeypatch.setattr(ModelRunner, "short_step_tokens", lambda self: 48)
    capped = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256,
                 max_tokens_with_decodes="auto")
    assert capped.engine.config.scheduler.max_tokens_with_decodes == 48
    sizes = []
    schedule = capped.engine.scheduler.schedule

    def record():
        out = schedule()
        decodes = sum(1 for r in out.scheduled if r.num_scheduled_tokens == 1)
        sizes.append((decodes, out.num_batched_tokens))
        return out

    capped.engine.scheduler.schedule = record
    arrivals = [capped.engine.add_request(f"r{i}", p, params) for i, p in enumerate(prompts)]
    assert arrivals == [None] * len(prompts)
    outs = {}
    while capped.engine.has_unfinished():
        for o in capped.engine.step():
            if o.finished:
                outs[o.request_id] = o
    got = [outs[f"r{i}"] for i in range(len(prompts))]
    assert _texts(got) == _texts(tiny_llm.generate(prompts, params, use_tqdm=False))
    with_decodes = [n for d, n in sizes if d]
    assert with_decodes and max(with_decodes) <= 48, sizes
    assert max(n for _, n in sizes) > 48  # the first step, with no decode, was not capped
    _assert_idle(capped)


def test_prefix_cache_hits_and_same_output(tiny_dir, tiny_llm):  # noqa: F811
    rng = random.Random(7)
    prefix = [rng.randrange(100, 40000) for _ in range(1000)]
    a = {"prompt_token_ids": prefix + [11, 12, 13]}
    b = {"prompt_token_ids": prefix + [21, 22, 23, 24]}
    params = SamplingParams(max_tokens=8, **GREEDY)
    first = tiny_llm.generate([a], params, use_tqdm=False)[0]
    second = tiny_llm.generate([b], params, use_tqdm=False)[0]
    assert first.num_cached_tokens < 16
    assert second.num_cached_tokens == 992  # 62 full blocks of 16 shared
    off = LLM(str(tiny_dir), device="cpu", enable_prefix_caching=False,
              max_num_batched_tokens=256)
    ref = off.generate([a, b], params, use_tqdm=False)
    assert _texts([first, second]) == _texts(ref)
    assert ref[1].num_cached_tokens == 0


def test_seed_reproducible_whatever_the_batch(tiny_llm):
    p = _prompts(1, seed=11)[0]
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=10, ignore_eos=True)
    alone = tiny_llm.generate([p], seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = _prompts(5, seed=12)
    mixed = tiny_llm.generate(
        others[:2] + [p] + others[2:],
        [SamplingParams(temperature=1.0, max_tokens=10)] * 2 + [seeded]
        + [SamplingParams(temperature=0.7, seed=5, max_tokens=10)] * 3,
        use_tqdm=False,
    )
    assert mixed[2].outputs[0].token_ids == alone


def test_n_choices_share_prompt_and_differ(tiny_llm):
    p = _prompts(1, seed=21, lo=40, hi=40)[0]
    out = tiny_llm.generate([p], SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=8,
                                                ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    _assert_idle(tiny_llm)


def test_logprobs_and_stop_token(tiny_llm):
    p = _prompts(1, seed=31)[0]
    base = tiny_llm.generate([p], SamplingParams(max_tokens=6, logprobs=3, **GREEDY),
                             use_tqdm=False)[0].outputs[0]
    assert len(base.logprobs) == 6
    for tok, lp in zip(base.token_ids, base.logprobs, strict=False):
        assert tok in lp and len(lp) >= 3
        assert lp[tok] == pytest.approx(max(lp.values()))  # greedy picks the top token
    stop_tok = base.token_ids[3]
    cut = tiny_llm.generate([p], SamplingParams(max_tokens=6, stop_token_ids=[stop_tok],
                                                **GREEDY), use_tqdm=False)[0].outputs[0]
    first = base.token_ids.index(stop_tok)
    assert cut.token_ids == base.token_ids[: first + 1]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop_tok


def test_too_long_prompt_is_refused_with_both_lengths(tiny_llm):
    n = tiny_llm.engine.max_model_len
    with pytest.raises(ValueError, match=f"{n}.*{n + 5}"):
        tiny_llm.generate([{"prompt_token_ids": [5] * (n + 5)}], use_tqdm=False)
    _assert_idle(tiny_llm)


def test_bad_prompt_token_ids_are_refused(tiny_llm):
    vocab = tiny_llm.engine.loaded.arch.vocab_size
    for bad in ([5, -1, 7], [5, vocab], [1.5, 2], ["3"], [None], [2**70]):
        with pytest.raises(ValueError, match=f"integers in \\[0, {vocab}\\)"):
            tiny_llm.generate([{"prompt_token_ids": bad}], use_tqdm=False)
    _assert_idle(tiny_llm)
    out = tiny_llm.generate([{"prompt_token_ids": [0, vocab - 1, True]}],
                            SamplingParams(max_tokens=1, **GREEDY), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1
    assert out[0].prompt_token_ids == [0, vocab - 1, 1]  # kept as plain ints
    assert all(type(t) is int for t in out[0].prompt_token_ids)


def test_final_only_requests_report_once_with_the_streamed_result(tiny_llm):
    """``final_only`` (what LLM.generate adds requests with): no output until the request
    finishes, then the same tokens and text as a streamed twin of it."""
    eng = tiny_llm.engine
    prompt = _prompts(1, seed=43)[0]
    eng.add_request("final", prompt, SamplingParams(max_tokens=9, **GREEDY), final_only=True)
    eng.add_request("stream", prompt, SamplingParams(max_tokens=9, **GREEDY))
    seen: dict[str, list] = {"final": [], "stream": []}
    while eng.has_unfinished():
        for out in eng.step():
            seen[out.request_id].append(out)
    assert len(seen["final"]) == 1 and seen["final"][0].finished
    assert len(seen["stream"]) == 9
    final, streamed = seen["final"][0].outputs[0], seen["stream"][-1].outputs[0]
    assert final.token_ids == streamed.token_ids and len(final.token_ids) == 9
    assert final.text == streamed.text and final.finish_reason == "length"
    _assert_idle(tiny_llm)


def test_abort_frees_blocks(tiny_llm):
    eng = tiny_llm.engine
    for i, p in enumerate(_prompts(4, seed=41)):
        eng.add_request(f"a{i}", p, SamplingParams(max_tokens=50, **GREEDY))
    eng.step()
    eng.step()
    for i in range(4):
        eng.abort(f"a{i}")
    _assert_idle(tiny_llm)


def test_demo_model_answers_paris(demo_dir):  # noqa: F811
    llm = LLM(str(demo_dir), device="cpu")
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason in ("stop", "length")


def test_prompt_logprobs_across_chunks(tiny_dir):  # noqa: F811
    """A prompt split over several prefill chunks gets one logprob entry per prompt token."""
    import torch

    from edge_llm.model.full_forward import full_logits

    llm = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=32, max_num_seqs=8)
    ids = _prompts(1, seed=51, lo=90, hi=90)[0]["prompt_token_ids"]
    out = llm.generate([{"prompt_token_ids": ids}],
                       SamplingParams(max_tokens=2, prompt_logprobs=2, **GREEDY),
                       use_tqdm=False)[0]
    plp = out.prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    ref = full_logits(llm.engine.loaded.model, torch.tensor(ids)).log_softmax(-1)
    for pos in (1, 31, 32, 33, 89):
        assert plp[pos][ids[pos]] == pytest.approx(float(ref[pos - 1, ids[pos]]), abs=1e-4)
        assert len(plp[pos]) >= 2


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_and_wake_give_the_same_outputs(tiny_dir, level):  # noqa: F811
    llm = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, max_num_seqs=16)
    prompts = _prompts(3, seed=61)
    params = SamplingParams(max_tokens=8, **GREEDY)
    before = llm.generate(prompts, params, use_tqdm=False)
    llm.engine.sleep(level)
    assert llm.engine.is_sleeping and llm.engine.runner.kv is None
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(prompts, params, use_tqdm=False)
    llm.engine.wake_up()
    after = llm.generate(prompts, params, use_tqdm=False)
    assert _texts(after) == _texts(before)
    _assert_idle(llm)


def test_sleep_refused_while_busy(tiny_llm):
    eng = tiny_llm.engine
    eng.add_request("busy", _prompts(1, seed=71)[0], SamplingParams(max_tokens=5, **GREEDY))
    with pytest.raises(ValueError, match="in flight"):
        eng.sleep(1)
    eng.abort("busy")
    _assert_idle(tiny_llm)


def test_kv_budget_too_small_fails_with_numbers_and_flag(tiny_dir):  # noqa: F811
    from edge_llm.engine.kv_cache import KVBudgetError

    with pytest.raises(KVBudgetError) as err:
        LLM(str(tiny_dir), device="cpu", max_model_len=2048, kv_cache_memory=64 * 1024)
    msg = str(err.value)
    assert "2048" in msg and "--kv-cache-memory" in msg and "--max-model-len" in msg


@pytest.mark.parametrize("block_size", [8, 32])
def test_other_block_sizes_same_greedy_output(tiny_dir, tiny_llm, block_size):  # noqa: F811
    prompts = _prompts(4, seed=81)
    params = SamplingParams(max_tokens=6, **GREEDY)
    ref = tiny_llm.generate(prompts, params, use_tqdm=False)
    other = LLM(str(tiny_dir), device="cpu", block_size=block_size, max_num_seqs=16,
                max_num_batched_tokens=256)
    assert _texts(other.generate(prompts, params, use_tqdm=False)) == _texts(ref)
    with pytest.raises(ValueError, match="block_size"):
        LLM(str(tiny_dir), device="cpu", block_size=12)


def test_fp8_kv_cache(tiny_dir, tiny_llm):  # noqa: F811
    import torch

    budget = 1 << 20
    plain = LLM(str(tiny_dir), device="cpu", kv_cache_memory=budget, max_num_batched_tokens=256)
    fp8 = LLM(str(tiny_dir), device="cpu", kv_cache_memory=budget, max_num_batched_tokens=256,
              kv_cache_dtype="fp8")
    k_cache, v_cache = fp8.engine.runner.kv.layers[0]
    assert k_cache.dtype == torch.uint8 and plain.engine.runner.kv.layers[0][0].dtype == \
        torch.float32
    assert v_cache.dtype == torch.uint8 and v_cache.is_contiguous()  # token-major, as the keys
    # one byte per element against fp32's four: four times the blocks in the same memory
    assert fp8.engine.runner.plan.num_gpu_blocks == 4 * plain.engine.runner.plan.num_gpu_blocks
    info = fp8.engine.stats()["cache_config"]
    assert info["cache_dtype"] == "fp8"
    assert info["num_gpu_blocks"] == str(fp8.engine.runner.plan.num_gpu_blocks)
    prompts = _prompts(10, seed=5, lo=10, hi=40)
    params = SamplingParams(max_tokens=30, **GREEDY)
    ref = fp8.generate(prompts, params, use_tqdm=False)
    assert int(k_cache.count_nonzero()) > 0 and int(v_cache.count_nonzero()) > 0
    # under preemption (recompute and swap) the fp8 engine gives what it gives unpressed
    for swap, mode in ((1.0, "swap"), (0.0, None)):
        small = LLM(str(tiny_dir), device="cpu", block_size=8, num_gpu_blocks_override=24,
                    swap_space=swap, max_num_batched_tokens=128, max_num_seqs=16,
                    max_model_len=160, growth_reserve=0, preemption_mode=mode,
                    kv_cache_dtype="fp8")
        assert _texts(small.generate(prompts, params, use_tqdm=False)) == _texts(ref)
        assert small.engine.scheduler.stats()["num_preemptions"] > 0
        _assert_idle(small)
    # fp8 rounding moves the logits a little: most greedy tokens still agree with fp32's
    full = tiny_llm.generate(prompts, params, use_tqdm=False)
    same = sum(a == b for o, f in zip(ref, full, strict=True)
               for a, b in zip(o.outputs[0].token_ids, f.outputs[0].token_ids, strict=True))
    assert same > 0.5 * 10 * 30


def test_kv_cache_dtype_is_checked(tiny_dir):  # noqa: F811
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(tiny_dir), device="cpu", kv_cache_dtype="int8")


def test_completion_snapshot_copies_every_field():
    """``CompletionOutput.snapshot`` (each step's output) is built field by field: a field
    added to the class without being added there fails here."""
    from dataclasses import asdict, fields

    from edge_llm.outputs import CompletionOutput

    c = CompletionOutput(index=2, text="ab", token_ids=[5, 6], cumulative_logprob=-1.5,
                         logprobs=[{5: -0.5}], finish_reason="stop", stop_reason=7,
                         text_delta="b", token_ids_delta=[6], logprobs_delta=[{6: -1.0}])
    assert {f.name for f in fields(c)} == set(asdict(c))
    defaults = CompletionOutput(index=0, text="", token_ids=[])
    assert all(getattr(c, f.name) != getattr(defaults, f.name) for f in fields(c))
    snap = c.snapshot()
    assert asdict(snap) == asdict(c)
    assert snap.token_ids is not c.token_ids and snap.logprobs is not c.logprobs


def test_cuda_graph_sizes_reach_the_runner(tiny_dir):  # noqa: F811
    from edge_llm.engine.cuda_graphs import capture_sizes

    llm = LLM(str(tiny_dir), device="cpu", max_num_seqs=48, cuda_graph_sizes=[8, 1, 4, 4])
    assert llm.engine.runner.graph_sizes == [1, 4, 8]
    assert LLM(str(tiny_dir), device="cpu", max_num_seqs=48).engine.runner.graph_sizes == \
        capture_sizes(48) == [1, 2, 4, 8, 16, 24, 32, 48]
    with pytest.raises(ValueError, match="positive ints"):
        LLM(str(tiny_dir), device="cpu", cuda_graph_sizes=[0])
