"""Async output processing (llm_engine.py): a step's outputs are built while the next step
runs. On CPU it is off by default; these tests switch it on and hold it to the synchronous
engine's results, request by request."""

from __future__ import annotations

import random

import pytest

from edge_llm import LLM, SamplingParams
from edge_llm.engine.llm_engine import StepError
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int = 0, longest: int = 50) -> list[dict]:
    """Prompts of 3 to ``longest`` random token ids."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(100, 40000)
                                  for _ in range(rng.randint(3, longest))]}
            for _ in range(n)]


def _fields(outs):
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs,
              c.cumulative_logprob) for c in o.outputs] for o in outs]


def _assert_idle(llm: LLM) -> None:
    eng = llm.engine
    assert not eng.has_unfinished() and eng._in_flight is None
    eng.scheduler.check_integrity()
    st = eng.stats()
    assert st["num_free_blocks"] == st["num_total_blocks"]


@pytest.fixture(scope="module")
def pair(tiny_dir):  # noqa: F811
    """The same engine twice: as built on CPU (synchronous), and with async outputs."""
    sync = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16)
    assert sync.engine.async_output is False  # the CPU default
    asyn = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16)
    asyn.engine.set_loop(async_output=True)
    return sync, asyn


def test_same_outputs_for_mixed_sampling_options(pair):
    sync, asyn = pair
    prompts = _prompts(12)
    params = []
    for i in range(12):
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(max_tokens=5 + i, **GREEDY))
        elif kind == 1:
            params.append(SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, seed=i,
                                         ignore_eos=True, logprobs=2))
        elif kind == 2:
            params.append(SamplingParams(max_tokens=7, temperature=0.8, seed=i, n=2,
                                         presence_penalty=0.5, ignore_eos=True))
        else:
            params.append(SamplingParams(max_tokens=12, min_tokens=3, temperature=0.0))
    ref = sync.generate(prompts, params, use_tqdm=False)
    got = asyn.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    _assert_idle(asyn)


def test_stop_string_found_a_step_late_gives_the_same_output(pair):
    sync, asyn = pair
    prompts = _prompts(4, seed=5)
    free = sync.generate(prompts, SamplingParams(max_tokens=40, **GREEDY), use_tqdm=False)
    params = []
    for out in free:  # a stop string from the middle of each greedy text
        text = out.outputs[0].text
        mid = len(text) // 2
        params.append(SamplingParams(max_tokens=40, stop=[text[mid:mid + 3]], **GREEDY))
    ref = sync.generate(prompts, params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "stop" for o in ref)
    got = asyn.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    _assert_idle(asyn)


def _stream(llm: LLM, prompts, params) -> dict[str, list]:
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"s{i}", p, params)
    seen: dict[str, list] = {}
    while eng.has_unfinished():
        for out in eng.step():
            c = out.outputs[0]
            seen.setdefault(out.request_id, []).append(
                (c.text_delta, list(c.token_ids_delta), out.finished))
    return seen


def test_streamed_deltas_are_the_same(pair):
    sync, asyn = pair
    prompts = _prompts(6, seed=9)
    params = SamplingParams(max_tokens=10, **GREEDY)
    assert _stream(asyn, prompts, params) == _stream(sync, prompts, params)
    _assert_idle(asyn)


def test_abort_while_the_step_is_in_flight(pair):
    _, asyn = pair
    eng = asyn.engine
    prompts = _prompts(2, seed=2)
    params = SamplingParams(max_tokens=6, **GREEDY)
    eng.add_request("a", prompts[0], params)
    eng.add_request("b", prompts[1], params)
    assert eng.step() == []  # launched; nothing to report yet
    assert eng._in_flight is not None and eng.has_unfinished()
    with pytest.raises(ValueError, match="in flight"):
        eng.sleep(1)
    eng.abort("a")
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert {o.request_id for o in outs} == {"b"}
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 6
    _assert_idle(asyn)


def test_only_a_step_in_flight_still_blocks_sleep(pair):
    """A stop string in the first token's text: the request finishes while building that
    step's outputs, after the next step (holding it) was launched. Nothing is unfinished in
    the scheduler, but the engine is not idle until that step is collected."""
    sync, asyn = pair
    eng = asyn.engine
    for prompt in _prompts(8, seed=11):
        first = sync.generate([prompt], SamplingParams(max_tokens=1, **GREEDY),
                              use_tqdm=False)[0].outputs[0].text
        if first.strip():
            break
    else:
        pytest.fail("no prompt whose first token has visible text")
    eng.add_request("s", prompt, SamplingParams(max_tokens=8, stop=[first], **GREEDY))
    assert eng.step() == []  # the prefill launched
    outs = eng.step()  # its token: stop string found while the next step runs
    assert [(o.request_id, o.finished, o.outputs[0].finish_reason) for o in outs] == [
        ("s", True, "stop")]
    assert not eng.scheduler.has_unfinished() and eng.has_unfinished()
    with pytest.raises(ValueError, match="a step is in flight"):
        eng.sleep(1)
    assert eng.step() == []  # the dropped token's step
    _assert_idle(asyn)


def test_a_failed_launch_still_delivers_the_step_before_it(pair, monkeypatch):
    _, asyn = pair
    eng = asyn.engine
    prompts = _prompts(2, seed=4)
    eng.add_request("one", prompts[0], SamplingParams(max_tokens=1, **GREEDY))
    eng.add_request("more", prompts[1], SamplingParams(max_tokens=5, **GREEDY))
    eng.step()  # both prefills in flight

    def broken(sched):
        raise RuntimeError("device lost")

    monkeypatch.setattr(eng.runner, "launch", broken)
    with pytest.raises(StepError) as info:
        eng.step()  # "one" finishes with the prefill's token; "more" fails to launch
    monkeypatch.undo()
    assert info.value.ids == {"more"}
    assert [(o.request_id, o.finished) for o in info.value.outputs] == [("one", True)]
    _assert_idle(asyn)


def test_demo_model_answer_is_unchanged(demo_dir):  # noqa: F811
    llm = LLM(str(demo_dir), device="cpu")
    llm.engine.set_loop(async_output=True)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    params = SamplingParams(max_tokens=24, temperature=0.0, stop=["."])
    out = llm.chat(chat, params, use_tqdm=False)[0].outputs[0]
    llm.engine.set_loop(async_output=False)
    ref = llm.chat(chat, params, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.token_ids, out.finish_reason) == (
        ref.text, ref.token_ids, ref.finish_reason)
    assert "Paris" in out.text
    _assert_idle(llm)


@pytest.mark.parametrize("loop", [dict(async_output=False),
                                  dict(async_output=True, run_ahead=True)])
def test_a_dropped_engine_is_freed_at_once(tiny_dir, loop):  # noqa: F811
    """The loop chosen holds no reference back to its engine: dropping the last reference
    frees the engine and its memory without waiting for a GC pass."""
    import gc
    import weakref

    llm = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16)
    llm.engine.set_loop(**loop)
    llm.generate(_prompts(2), SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)
    engine, runner = weakref.ref(llm.engine), weakref.ref(llm.engine.runner)
    gc.disable()
    try:
        del llm
        assert engine() is None and runner() is None
    finally:
        gc.enable()


def test_the_loop_changes_only_between_steps(pair):
    _, asyn = pair
    eng = asyn.engine
    with pytest.raises(ValueError, match="needs async output"):
        eng.set_loop(async_output=False, run_ahead=True)
    eng.add_request("x", _prompts(1)[0], SamplingParams(max_tokens=3, **GREEDY))
    eng.step()  # launched, in flight
    with pytest.raises(RuntimeError, match="in flight"):
        eng.set_loop(async_output=False)
    assert eng.async_output and not eng.run_ahead
    while eng.has_unfinished():
        eng.step()
    _assert_idle(asyn)
