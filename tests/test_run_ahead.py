"""Decode run-ahead (engine/scheduler_ahead.py): a decode step's successor is launched before
its tokens reach the host, fed with them on the device. On CPU it is off by default; these
tests switch it on and hold it to the engine with async outputs only, which forms the same
batches (a run-ahead step is either the scheduled step or dropped), request by request."""

from __future__ import annotations

import pytest

from edge_llm import LLM, SamplingParams
from edge_llm.engine.scheduler_ahead import ahead_matches, plan_ahead
from edge_llm.engine.scheduler_output import ScheduledSeq, SchedulerOutput
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401
from tests.test_async_output import GREEDY, _assert_idle, _fields
from tests.test_async_output import _prompts as async_prompts


def _prompts(n: int, seed: int = 0) -> list[dict]:
    """Prompts of 3-40 tokens (the memory-pressure case caps the model at 128)."""
    return async_prompts(n, seed, longest=40)


def _engine(tiny_dir, ahead: bool, **kw) -> LLM:  # noqa: F811
    llm = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256, block_size=16, **kw)
    assert llm.engine.run_ahead is False  # the CPU default
    llm.engine.set_loop(async_output=True, run_ahead=ahead)
    return llm


@pytest.fixture(scope="module")
def pair(tiny_dir):  # noqa: F811
    return _engine(tiny_dir, False), _engine(tiny_dir, True)


def test_greedy_outputs_are_the_same_and_steps_run_ahead(pair):
    plain, ahead = pair
    prompts = _prompts(10)
    params = [SamplingParams(max_tokens=4 + 7 * i, **GREEDY) for i in range(10)]  # 4..67
    ref = plain.generate(prompts, params, use_tqdm=False)
    before = ahead.engine.ahead_steps.copy()
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    adopted = ahead.engine.ahead_steps["adopted"] - before["adopted"]
    # 68 steps: the prefills, the first decode step and the last are not run ahead
    assert adopted >= 60, ahead.engine.ahead_steps
    _assert_idle(ahead)


def test_stop_tokens_found_on_the_device_side_of_a_run_ahead_step(pair):
    """A sampled stop token ends its sequence while the step after it (with a row for it)
    is already launched: that row's token is dropped, the others go on."""
    plain, ahead = pair
    prompts = _prompts(6, seed=3)
    free = plain.generate(prompts, SamplingParams(max_tokens=30, **GREEDY), use_tqdm=False)
    params = [SamplingParams(max_tokens=30, temperature=0.0,
                             stop_token_ids=[o.outputs[0].token_ids[5 + 3 * i]])
              for i, o in enumerate(free)]
    ref = plain.generate(prompts, params, use_tqdm=False)
    assert any(o.outputs[0].finish_reason == "stop" for o in ref)
    before = ahead.engine.ahead_steps["adopted"]
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    # 21 steps (outputs of 6..21 tokens): all but the prefill, the first decode step and
    # the one after the last stop token (launched, then dropped) are adopted, also after a
    # step that carried rows of stopped sequences
    assert ahead.engine.ahead_steps["adopted"] - before >= 18, ahead.engine.ahead_steps
    _assert_idle(ahead)


def test_rows_that_need_the_host_tokens_keep_the_plain_order(pair):
    """Penalties, logprobs, pending min_tokens and n > 1 read what the host holds: a batch
    with any of them is not run ahead, and nothing changes."""
    plain, ahead = pair
    prompts = _prompts(8, seed=7)
    params = [SamplingParams(max_tokens=12, **GREEDY),
              SamplingParams(max_tokens=12, temperature=0.9, seed=1, ignore_eos=True),
              SamplingParams(max_tokens=12, presence_penalty=0.5, **GREEDY),
              SamplingParams(max_tokens=12, logprobs=2, **GREEDY),
              SamplingParams(max_tokens=12, min_tokens=10, temperature=0.0),
              SamplingParams(max_tokens=9, n=2, temperature=0.8, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=20, **GREEDY),
              SamplingParams(max_tokens=16, repetition_penalty=1.2, **GREEDY)]
    ref = plain.generate(prompts, params, use_tqdm=False)
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    _assert_idle(ahead)


def test_requests_arriving_and_aborted_between_steps(pair):
    plain, ahead = pair
    prompts = _prompts(5, seed=5)
    params = SamplingParams(max_tokens=24, **GREEDY)

    def drive(llm):
        eng = llm.engine
        seen: dict[str, list] = {}
        eng.add_request("r0", prompts[0], params)
        eng.add_request("r1", prompts[1], params)
        for i in range(60):
            if i in (6, 11, 17):
                eng.add_request(f"r{2 + (i > 6) + (i > 11)}", prompts[2 + (i > 6) + (i > 11)],
                                params)
            if i == 9:
                eng.abort("r1")
            for out in eng.step():
                c = out.outputs[0]
                seen.setdefault(out.request_id, []).append(
                    (c.text_delta, list(c.token_ids_delta), out.finished))
            if not eng.has_unfinished():
                break
        return seen

    ref = drive(plain)
    before = ahead.engine.ahead_steps["adopted"]
    got = drive(ahead)
    assert got == ref and set(got) == {"r0", "r1", "r2", "r3", "r4"}
    assert ahead.engine.ahead_steps["adopted"] > before
    _assert_idle(ahead)


def test_under_memory_pressure(tiny_dir):  # noqa: F811
    """A KV cache too small for every sequence: preemptions (recomputed), and run-ahead
    steps that opened blocks ahead of the scheduler."""
    kw = dict(num_gpu_blocks_override=14, growth_reserve=0, max_model_len=128)
    plain, ahead = _engine(tiny_dir, False, **kw), _engine(tiny_dir, True, **kw)
    prompts = _prompts(6, seed=8)
    params = SamplingParams(max_tokens=40, **GREEDY)
    ref = plain.generate(prompts, params, use_tqdm=False)
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    assert ahead.engine.scheduler.num_preemptions > 0
    assert ahead.engine.ahead_steps["adopted"] > 0
    _assert_idle(ahead)


@pytest.mark.parametrize("drop", [False, True])
def test_random_sampling_draws_as_without_run_ahead(pair, monkeypatch, drop):
    """Seeded and unseeded sampling run ahead in the order the plain engine samples in, so
    the draws are the same; a dropped run-ahead step gives its draws back (the sampler's
    generators are restored), so the scheduled step after it draws them again."""
    plain, ahead = pair
    if drop:
        import edge_llm.engine.llm_engine as le

        monkeypatch.setattr(le, "ahead_matches", lambda rows, nxt: False)
    prompts = _prompts(6, seed=21)
    params = [SamplingParams(max_tokens=14 + 3 * i, temperature=0.9, top_p=0.9,
                             seed=100 + i if i % 2 else None, ignore_eos=True)
              for i in range(6)]
    ref = plain.generate(prompts, params, use_tqdm=False)
    before = ahead.engine.ahead_steps.copy()
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    assert ahead.engine.ahead_steps["dropped" if drop else "adopted"] - before[
        "dropped" if drop else "adopted"] >= 20, ahead.engine.ahead_steps
    _assert_idle(ahead)


def test_dropped_run_ahead_steps_change_nothing(pair, monkeypatch):
    """Every run-ahead step dropped (as when the scheduled step differs): the scheduled one
    runs after it, over the slots it wrote, and the outputs stay the same."""
    plain, ahead = pair
    import edge_llm.engine.llm_engine as le

    monkeypatch.setattr(le, "ahead_matches", lambda rows, nxt: False)
    prompts = _prompts(5, seed=12)
    params = [SamplingParams(max_tokens=10 + 9 * i, **GREEDY) for i in range(5)]
    ref = plain.generate(prompts, params, use_tqdm=False)
    before = ahead.engine.ahead_steps.copy()
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    assert ahead.engine.ahead_steps["dropped"] - before["dropped"] >= 20
    assert ahead.engine.ahead_steps["adopted"] == before["adopted"]
    _assert_idle(ahead)


def test_plan_ahead_rules(tiny_dir):  # noqa: F811
    """The plan: next positions, blocks opened where a row crosses into a new one, the rows
    whose last token is in flight left out; matches only the same rows at the same
    positions, with nothing swapped, copied or preempted."""
    llm = _engine(tiny_dir, False)
    eng = llm.engine
    sched = eng.scheduler
    eng.set_loop(async_output=False)
    for i, n in enumerate((15, 3)):  # prompt lengths: one row about to open a new block
        eng.add_request(f"p{i}", {"prompt_token_ids": list(range(100, 100 + n))},
                        SamplingParams(max_tokens=2 if i else 30, **GREEDY))
    eng.step()  # both prefills
    prev = sched.schedule()  # the first decode step (not run)
    assert [r.start_pos for r in prev.scheduled] == [15, 3]
    sched.waiting.append(sched.running[0])  # a waiting request: nothing can be planned
    assert plan_ahead(sched, prev) is None
    sched.waiting.clear()
    blocks = [len(s.block_table) for s in sched.running]
    free = sched.pool.num_free_blocks
    rows, index = plan_ahead(sched, prev)
    # p1 (max_tokens 2) takes its last token in prev: left out; p0 opens a block at 16
    assert [(r.seq.request_id, r.start_pos) for r in rows] == [("p0", 16)] and index == [0]
    assert [len(s.block_table) for s in sched.running] == [blocks[0] + 1, blocks[1]]
    assert sched.pool.num_free_blocks == free - 1
    same = SchedulerOutput(scheduled=[ScheduledSeq(rows[0].seq, [7], 16, 1,
                                                   rows[0].block_table, True)])
    assert ahead_matches(rows, same)
    moved = SchedulerOutput(scheduled=[ScheduledSeq(rows[0].seq, [7], 17, 1,
                                                    rows[0].block_table, True)])
    assert not ahead_matches(rows, moved)
    swapped = SchedulerOutput(scheduled=same.scheduled, blocks_to_copy=[(1, 2)])
    assert not ahead_matches(rows, swapped) and not ahead_matches(rows, SchedulerOutput())
    eng.scheduler.update_from_output(prev, {s.seq.seq_id: 5 for s in prev.scheduled})
    eng.abort("p0")
    _assert_idle(llm)


def test_constrained_rows_skip_run_ahead_and_keep_their_outputs(pair):
    """A constrained row's next mask needs its previous token consumed on the host, so steps
    with constrained rows are not run ahead; the outputs are those of the plain engine."""
    from edge_llm.sampling_params import StructuredOutputsParams

    plain, ahead = pair
    prompts = _prompts(6, seed=5)
    spec = StructuredOutputsParams(regex=r"(yes|no)( (yes|no|maybe)){0,40}\.")
    params = [SamplingParams(max_tokens=25, temperature=0.0,
                             structured_outputs=spec if i % 2 else None) for i in range(6)]
    ref = plain.generate(prompts, params, use_tqdm=False)
    before = ahead.engine.ahead_steps.copy()
    got = ahead.generate(prompts, params, use_tqdm=False)
    assert _fields(got) == _fields(ref)
    assert ahead.engine.ahead_steps["adopted"] == before["adopted"]
    _assert_idle(ahead)
