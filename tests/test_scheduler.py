"""Scheduler scenarios: chunked prefill, refusal, n > 1, abort, stop conditions (the fake KV
cache and sampler are in tests/scheduler_helpers.py)."""

from __future__ import annotations

import random

import pytest

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler
from edge_llm.engine.sequence import SequenceStatus
from edge_llm.sampling_params import SamplingParams
from tests.scheduler_helpers import (
    VOCAB,
    FakeKV,
    count_step,
    drain,
    make,
    outputs_of,
    rand_prompt,
    reference_outputs,
    step,
)


def test_chunked_prefill_mixes_with_decodes(rng: random.Random) -> None:
    sched = make(64, block_size=16, max_num_seqs=4, budget=16)
    kv = FakeKV(sched)
    (dec,) = sched.add_request("dec", rand_prompt(rng, 5), SamplingParams(max_tokens=40))
    step(sched, kv)
    (long,) = sched.add_request("long", rand_prompt(rng, 100), SamplingParams(max_tokens=3))
    chunks = []
    while long.num_output_tokens == 0:
        before = dec.num_output_tokens
        out, _ = step(sched, kv)
        rows = {r.seq.request_id: r for r in out.scheduled}
        assert rows["dec"].num_scheduled_tokens == 1 and rows["dec"].do_sample
        assert dec.num_output_tokens == before + 1  # the decode never stalls
        r = rows["long"]
        assert (
            r.start_pos == sum(chunks)
            and r.token_ids
            == long.prompt_token_ids[r.start_pos : r.start_pos + r.num_scheduled_tokens]
        )
        chunks.append(r.num_scheduled_tokens)
        assert r.do_sample == (sum(chunks) == 100)
    assert chunks == [15] * 6 + [10]
    drain(sched, kv)


def test_a_spent_budget_admits_no_one(rng: random.Random) -> None:
    sched = make(10, budget=8)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, 8), SamplingParams(max_tokens=3), 0.0)
    (b,) = sched.add_request("b", rand_prompt(rng, 5), SamplingParams(max_tokens=3), 1.0)
    out, _ = step(sched, kv)
    assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(a, 8)]
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    drain(sched, kv)


def test_decodes_do_not_wait_for_an_earlier_arrivals_prefill(rng: random.Random) -> None:
    """Priority follows arrival_time, which the caller may set earlier than a running
    request's: a's prompt is then chunked ahead of b in the queue, and b still decodes in
    every step."""
    sched = make(40, block_size=16, budget=16)
    kv = FakeKV(sched)
    (b,) = sched.add_request("b", rand_prompt(rng, 3), SamplingParams(max_tokens=10), 1.0)
    step(sched, kv)
    (a,) = sched.add_request("a", rand_prompt(rng, 40), SamplingParams(max_tokens=2), 0.0)
    for chunk in (15, 15, 10):
        out, _ = step(sched, kv)
        assert sched.running == [a, b]
        assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(b, 1), (a, chunk)]
    drain(sched, kv)


def test_steps_with_decodes_keep_to_their_cap(rng: random.Random) -> None:
    """``max_tokens_with_decodes``: while sequences decode, a step takes at most that many
    tokens, theirs included (a prompt joining them is chunked to the rest); a step with no
    decode takes the whole budget; decodes that alone reach the cap leave it off."""
    sched = make(200, block_size=16, max_num_seqs=8, budget=256, max_model_len=512,
                 max_tokens_with_decodes=64)
    kv = FakeKV(sched)
    (first,) = sched.add_request("first", rand_prompt(rng, 200), SamplingParams(max_tokens=50))
    out, _ = step(sched, kv)  # nothing decodes yet: the whole prompt in one step
    assert [r.num_scheduled_tokens for r in out.scheduled] == [200]
    for i in range(3):
        sched.add_request(f"d{i}", rand_prompt(rng, 4), SamplingParams(max_tokens=40))
    out, _ = step(sched, kv)
    assert [r.num_scheduled_tokens for r in out.scheduled] == [1, 4, 4, 4]
    (long,) = sched.add_request("long", rand_prompt(rng, 300), SamplingParams(max_tokens=2))
    chunks = []
    while long.num_output_tokens == 0:
        out, _ = step(sched, kv)
        rows = {r.seq.request_id: r.num_scheduled_tokens for r in out.scheduled}
        assert rows.pop("long") == out.num_batched_tokens - 4 and set(rows.values()) == {1}
        assert out.num_batched_tokens <= 64
        chunks.append(out.num_batched_tokens - 4)
    assert chunks == [60] * 5
    drain(sched, kv)

    # decodes alone at the cap: the prompt still gets the rest of the whole budget
    sched = make(200, block_size=16, max_num_seqs=8, budget=256, max_model_len=512,
                 max_tokens_with_decodes=3)
    kv = FakeKV(sched)
    for i in range(3):
        sched.add_request(f"d{i}", rand_prompt(rng, 4), SamplingParams(max_tokens=40))
    step(sched, kv)
    sched.add_request("p", rand_prompt(rng, 100), SamplingParams(max_tokens=2))
    out, _ = step(sched, kv)
    assert [r.num_scheduled_tokens for r in out.scheduled] == [1, 1, 1, 100]
    drain(sched, kv)

    # without chunked prefill a prompt cannot be cut: the cap is not applied
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_model_len=256,
                                      max_num_seqs=8, enable_chunked_prefill=False,
                                      growth_reserve=0, max_tokens_with_decodes=16),
                      CacheConfig(block_size=16), 200, 0)
    kv = FakeKV(sched)
    sched.add_request("d", rand_prompt(rng, 4), SamplingParams(max_tokens=40))
    step(sched, kv)
    sched.add_request("p", rand_prompt(rng, 100), SamplingParams(max_tokens=2))
    out, _ = step(sched, kv)
    assert [r.num_scheduled_tokens for r in out.scheduled] == [1, 100]
    drain(sched, kv)


@pytest.mark.parametrize("cap", [8, 31])
def test_one_decode_keeps_the_step_to_the_cap(rng: random.Random, cap: int) -> None:
    """One decode (1 token) and a prompt: the step takes ``cap`` tokens in all, even when the
    cap leaves the prompt only one token less than the rest of the budget would."""
    sched = make(40, block_size=16, budget=32, max_tokens_with_decodes=cap)
    kv = FakeKV(sched)
    (d,) = sched.add_request("d", rand_prompt(rng, 4), SamplingParams(max_tokens=20))
    step(sched, kv)
    (p,) = sched.add_request("p", rand_prompt(rng, 100), SamplingParams(max_tokens=2))
    out, _ = step(sched, kv)
    assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(d, 1), (p, cap - 1)]
    assert out.num_batched_tokens == cap
    drain(sched, kv)


@pytest.mark.parametrize("cap", [-1, 1.5, "512", True])
def test_cap_with_decodes_is_checked(cap) -> None:
    with pytest.raises(ValueError, match="max_tokens_with_decodes must be 'auto', None or"):
        SchedulerConfig(max_tokens_with_decodes=cap)
    for ok in ("auto", None, 0, 512):
        assert SchedulerConfig(max_tokens_with_decodes=ok).max_tokens_with_decodes == ok


def test_chunking_disabled_needs_whole_prompt_budget(rng: random.Random) -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(64\).*max_model_len \(256\)"):
        Scheduler(
            SchedulerConfig(
                max_num_batched_tokens=64,
                max_model_len=256,
                max_num_seqs=4,
                enable_chunked_prefill=False,
            ),
            CacheConfig(block_size=8),
            100,
            0,
        )
    sched = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=128,
            max_model_len=128,
            max_num_seqs=4,
            enable_chunked_prefill=False,
        ),
        CacheConfig(block_size=8),
        100,
        0,
    )
    kv = FakeKV(sched)
    sched.add_request("a", rand_prompt(rng, 10), SamplingParams(max_tokens=3))
    sched.add_request("c", rand_prompt(rng, 10), SamplingParams(max_tokens=3))
    step(sched, kv)
    (b,) = sched.add_request("b", rand_prompt(rng, 127), SamplingParams(max_tokens=4))
    out, _ = step(sched, kv)  # 2 decodes + 127 prefill > 128: the prompt waits, whole
    assert [r.num_scheduled_tokens for r in out.scheduled] == [1, 1]
    rows = [r for o in drain(sched, kv) for r in o.scheduled if r.seq is b]
    assert rows[0].num_scheduled_tokens == 127 and rows[0].do_sample
    assert b.num_output_tokens == 1 and b.finish_reason == "length"  # capped by max_model_len


def test_unchunked_prefill_reuses_the_prefix_cache(rng: random.Random) -> None:
    """Without chunking the prompt runs whole, whole minus its cached blocks: a prompt sharing
    two cached blocks computes only the rest, in the step it is admitted."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=64,
                                      max_num_seqs=4, enable_chunked_prefill=False),
                      CacheConfig(block_size=8, enable_prefix_caching=True), 20, 0)
    kv = FakeKV(sched)
    prefix = rand_prompt(rng, 16)
    sched.add_request("a", prefix + rand_prompt(rng, 5), SamplingParams(max_tokens=2))
    drain(sched, kv)
    (b,) = sched.add_request("b", prefix + rand_prompt(rng, 7), SamplingParams(max_tokens=2))
    out, _ = step(sched, kv)
    assert [(r.seq, r.start_pos, r.num_scheduled_tokens) for r in out.scheduled] == [(b, 16, 7)]
    assert b.num_cached_tokens == 16
    drain(sched, kv)


def test_admission_refusals_name_both_numbers(rng: random.Random) -> None:
    sched = make(10, max_num_seqs=4, max_model_len=64)  # 10 blocks of 8 = 80 positions
    with pytest.raises(ValueError, match=r"64 tokens.*max_model_len is 64"):
        sched.add_request("a", rand_prompt(rng, 64), SamplingParams())
    with pytest.raises(ValueError, match=r"needs 7 KV blocks.*has only 5"):
        make(5, max_model_len=64).add_request("a", rand_prompt(rng, 40), SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        sched.add_request("a", [], SamplingParams())
    with pytest.raises(ValueError, match=r"n=5 exceeds max_num_seqs=4"):
        sched.add_request("a", rand_prompt(rng, 3), SamplingParams(n=5))
    assert not sched.has_unfinished() and sched.num_unfinished_requests == 0
    # max_tokens=None means up to max_model_len; larger max_tokens is capped
    (s,) = sched.add_request("a", rand_prompt(rng, 60), SamplingParams(max_tokens=None))
    (t,) = sched.add_request("b", rand_prompt(rng, 50), SamplingParams(max_tokens=1000))
    assert (s.max_output_tokens, t.max_output_tokens) == (4, 14)
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request("a", rand_prompt(rng, 3), SamplingParams())
    kv = FakeKV(sched)
    drain(sched, kv)
    assert s.num_tokens == t.num_tokens == 64 and s.finish_reason == "length"


def test_refusals_say_what_is_wrong(rng: random.Random) -> None:
    """The whole message: it is what a client or an operator reads."""
    def refused(exc: type[Exception], message: str, call, *args) -> None:
        with pytest.raises(exc) as err:
            call(*args)
        assert err.value.args == (message,)

    refused(ValueError, "max_num_batched_tokens (4) must be >= max_num_seqs (8), or some "
            "decodes would wait a step.", make, 10, 0, 8, 8, 4)
    sched = make(10, max_num_seqs=4, max_model_len=64)
    refused(ValueError, "prompt_token_ids is empty: it must hold at least one token.",
            sched.add_request, "a", [], SamplingParams())
    refused(ValueError, "prompt_token_ids must be >= 0, got -3.",
            sched.add_request, "a", [5, -3, -1], SamplingParams())
    refused(ValueError, "prompt_token_ids has 64 tokens, but max_model_len is 64: at least one "
            "position must remain for the output.",
            sched.add_request, "a", rand_prompt(rng, 64), SamplingParams())
    assert not sched.has_unfinished()
    (seq,) = sched.add_request("a", rand_prompt(rng, 3), SamplingParams())
    first, again = sched.schedule(), sched.schedule()  # the same row twice
    sched.update_from_output(again, {seq.seq_id: 1})
    refused(RuntimeError, "update_from_output was already called for this SchedulerOutput.",
            sched.update_from_output, again, {seq.seq_id: 1})
    refused(RuntimeError, f"{seq!r} changed between schedule() and update_from_output().",
            sched.update_from_output, first, {seq.seq_id: 1})
    sched = make(10)
    (seq,) = sched.add_request("b", rand_prompt(rng, 3), SamplingParams())
    (other,) = sched.add_request("c", rand_prompt(rng, 3), SamplingParams())
    out = sched.schedule()
    assert [r.seq for r in out.scheduled] == [seq, other]
    refused(KeyError, f"sampled has no token for seq_id {other.seq_id} (request 'c'), which "
            "was scheduled with do_sample=True.", sched.update_from_output, out,
            {seq.seq_id: 1})
    # a refused update changed nothing: no row advanced, the same output applies whole
    assert (seq.num_computed_tokens, seq.output_token_ids) == (0, [])
    assert sched.update_from_output(out, {seq.seq_id: 1, other.seq_id: 2}) == [seq, other]
    assert (seq.num_computed_tokens, list(other.output_token_ids)) == (3, [2])
    # a row aborted in flight is skipped, and the rows after it are still checked
    out = sched.schedule()
    sched.abort("b")
    refused(KeyError, f"sampled has no token for seq_id {other.seq_id} (request 'c'), which "
            "was scheduled with do_sample=True.", sched.update_from_output, out, {})
    assert sched.update_from_output(out, {other.seq_id: 3}) == [other]


@pytest.mark.parametrize("prompt_len,num_copies", [(21, 2), (17, 0)])
def test_n_forks_after_prefill(rng: random.Random, prompt_len: int, num_copies: int) -> None:
    sched = make(40, block_size=16)
    kv = FakeKV(sched)
    prompt = rand_prompt(rng, prompt_len)
    (parent,) = sched.add_request("r", prompt, SamplingParams(n=3, max_tokens=6))
    out, got = step(sched, kv)
    assert [(r.start_pos, r.num_scheduled_tokens, r.do_sample) for r in out.scheduled] == [
        (0, prompt_len - 1, False)
    ]
    seqs = sched.sequences_of("r")
    assert got == [] and [s.index for s in seqs] == [0, 1, 2] and seqs[0] is parent
    assert all(s.block_table == parent.block_table for s in seqs)
    assert all(sched.pool.ref_count(b) == 3 for b in parent.block_table)
    shared = list(parent.block_table)
    out, got = step(sched, kv)
    assert sorted(got, key=lambda s: s.index) == seqs
    assert [(r.token_ids, r.start_pos, r.do_sample) for r in out.scheduled] == [
        ([prompt[-1]], prompt_len - 1, True)
    ] * 3
    assert len(out.blocks_to_copy) == num_copies
    assert all(src == shared[-1] for src, _ in out.blocks_to_copy)
    assert all(s.block_table[0] == shared[0] for s in seqs)  # full block stays shared
    assert len({s.block_table[-1] for s in seqs}) == 3  # each child writes its own block
    drain(sched, kv)
    assert len({tuple(s.output_token_ids) for s in seqs}) == 3
    assert all(s.num_output_tokens == 6 for s in seqs)


def test_n_forks_only_when_a_chunked_prefill_is_done(rng: random.Random) -> None:
    """A prompt prefilled in chunks forks after its last chunk; until then the request is one
    sequence. The siblings keep the request's arrival time (their priority)."""
    sched = make(40, block_size=8, budget=8)
    kv = FakeKV(sched)
    params = SamplingParams(n=3, max_tokens=4)
    (parent,) = sched.add_request("r", rand_prompt(rng, 20), params, 5.0)
    for computed in (8, 16):
        step(sched, kv)
        assert parent.num_computed_tokens == computed and sched.sequences_of("r") == [parent]
    step(sched, kv)  # the prompt's last token is fed by each sibling after the fork
    assert parent.num_computed_tokens == 19 and len(sched.sequences_of("r")) == 3
    assert [s.arrival_time for s in sched.sequences_of("r")] == [5.0] * 3
    drain(sched, kv)


def test_n_with_one_token_prompt_starts_n_sequences(rng: random.Random) -> None:
    sched = make(40)
    kv = FakeKV(sched)
    seqs = sched.add_request("r", [7], SamplingParams(n=3, max_tokens=2))
    assert [s.index for s in seqs] == [0, 1, 2]
    out, got = step(sched, kv)
    assert len(out.scheduled) == 3 and all(r.do_sample for r in out.scheduled)
    assert not out.blocks_to_copy and len(got) == 3
    drain(sched, kv)


def test_n_under_memory_pressure_matches_reference(rng: random.Random) -> None:
    reqs = [
        ("x", rand_prompt(rng, 21), SamplingParams(n=3, max_tokens=12), 0.0),
        ("y", rand_prompt(rng, 9), SamplingParams(n=2, max_tokens=15), 1.0),
    ]
    for cpu in (0, 8):
        sched = make(9, num_cpu_blocks=cpu, budget=16)
        kv = FakeKV(sched)
        for r in reqs:
            sched.add_request(*r)
        seqs = []
        while sched.has_unfinished():
            seqs += step(sched, kv)[1]
        assert sched.num_preemptions > 0
        assert outputs_of(seqs) == reference_outputs(reqs)
        assert sched.pool.num_free_blocks == 9


def test_abort_frees_everything(rng: random.Random) -> None:
    sched = make(6, num_cpu_blocks=16, budget=32, max_num_seqs=4)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 0.0)
    (b,) = sched.add_request("b", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 1.0)
    while not sched.swapped:
        step(sched, kv)
    (c,) = sched.add_request("c", rand_prompt(rng, 30), SamplingParams(n=2), 2.0)
    assert sched.num_running and sched.num_swapped and sched.num_waiting
    out = sched.schedule()
    assert sched.abort("a")  # running and scheduled: its row is skipped
    assert [s.status for s in sched.abort("b")] == [SequenceStatus.FINISHED_ABORTED]
    assert sched.abort("b") == [] and sched.abort("nope") == []
    kv.run(out)
    got = sched.update_from_output(out, {r.seq.seq_id: 1 for r in out.scheduled})
    assert got == []
    sched.check_integrity()
    sched.abort("c")
    sched.check_integrity()
    assert not sched.has_unfinished() and sched.num_unfinished_requests == 0
    assert sched.pool.num_free_blocks == 6 and sched.swap_space.num_free == 16
    # finished sequences (a running, b swapped, c waiting) hold no blocks and no slots
    assert [(s.block_table, s.swap_slots) for s in (a, b, c)] == [([], [])] * 3
    assert set(sched.schedule().finished_seq_ids) >= {out.scheduled[0].seq.seq_id}
    with pytest.raises(RuntimeError, match="already called"):
        sched.update_from_output(out, {})


def test_stop_conditions(rng: random.Random) -> None:
    sched = make(60, max_num_seqs=8)
    eos, stop = VOCAB + 1, VOCAB + 2

    def params(**kw: object) -> SamplingParams:
        p = SamplingParams(max_tokens=8, stop_token_ids=[stop], **kw)
        if not p.ignore_eos:
            p.all_stop_token_ids |= {eos}  # what the engine adds before add_request
        return p

    cases = {
        "eos": (params(), [3, eos]),
        "stop_id": (params(), [stop]),
        "ignore_eos": (params(ignore_eos=True), [eos, 4, stop]),
        "min_tokens": (params(min_tokens=3), [eos, stop, 5, eos]),
        "length": (params(), [1, 2, 3, 4, 5, 6, 7, 8, 9]),
    }
    seqs = {rid: sched.add_request(rid, rand_prompt(rng, 5), p)[0] for rid, (p, _) in cases.items()}
    kv = FakeKV(sched)
    while sched.has_unfinished():
        count_step(sched)
        out = sched.schedule()
        kv.run(out)
        sampled = {
            r.seq.seq_id: cases[r.seq.request_id][1][r.seq.num_output_tokens]
            for r in out.scheduled
            if r.do_sample
        }
        sched.update_from_output(out, sampled)
        sched.check_integrity()
    got = {rid: (s.output_token_ids, s.finish_reason, s.stop_reason) for rid, s in seqs.items()}
    assert got == {
        "eos": ([3, eos], "stop", None),
        "stop_id": ([stop], "stop", stop),
        "ignore_eos": ([eos, 4, stop], "stop", stop),
        "min_tokens": ([eos, stop, 5, eos], "stop", None),
        "length": ([1, 2, 3, 4, 5, 6, 7, 8], "length", None),
    }


def test_finish_by_caller_and_max_num_seqs(rng: random.Random) -> None:
    sched = make(100, max_num_seqs=3)
    kv = FakeKV(sched)
    for i in range(5):
        sched.add_request(f"r{i}", rand_prompt(rng, 4), SamplingParams(max_tokens=50), float(i))
    out, got = step(sched, kv)
    assert len(out.scheduled) == 3 and sched.num_running == 3 and sched.num_waiting == 2
    sched.finish(got[0], SequenceStatus.FINISHED_STOPPED, stop_reason="###")  # a stop string
    assert got[0].finish_reason == "stop" and got[0].stop_reason == "###"
    with pytest.raises(ValueError, match="FINISHED"):
        sched.finish(got[1], SequenceStatus.RUNNING)
    out, _ = step(sched, kv)
    assert len(out.scheduled) == 3 and got[0].seq_id in out.finished_seq_ids
    stats = sched.stats()
    assert stats["num_running"] == 3 and stats["num_waiting"] == 1
    assert 0 < stats["kv_cache_usage"] < 1 and stats["prefix_queries"] == 16
    for i in range(5):
        sched.abort(f"r{i}")
    assert sched.pool.num_free_blocks == 100


# ---- check_integrity: each broken invariant is named ---------------------------------------


def _running_and_swapped(rng: random.Random) -> tuple[Scheduler, list]:
    """a and b running (a has one output), c swapped out, w waiting behind it."""
    sched = make(5, num_cpu_blocks=8, block_size=8, max_num_seqs=4, budget=64)
    kv = FakeKV(sched)
    a, b, c = (sched.add_request(rid, rand_prompt(rng, n), SamplingParams(max_tokens=20), t)[0]
               for rid, n, t in (("a", 8, 0.0), ("b", 9, 1.0), ("c", 9, 2.0)))
    step(sched, kv)
    step(sched, kv)  # a needs a block: c is swapped out
    assert sched.swapped == [c] and sched.running == [a, b]
    (w,) = sched.add_request("w", rand_prompt(rng, 3), SamplingParams(), 3.0)
    sched.check_integrity()
    return sched, [a, b, c, w]


def _break(sched: Scheduler, a, b, c, w, case: str) -> list[str]:
    """Break one invariant; returns the problems check_integrity must name, in order."""
    pool = sched.pool
    if case == "running status":
        a.status = SequenceStatus.WAITING
        return [f"bad running {a!r}"]
    if case == "waiting holds a block":
        free = next(i for i in range(pool.num_blocks) if pool.ref_count(i) == 0)
        w.block_table = [free]
        return [f"bad waiting {w!r}"]
    if case == "running holds a stray block":
        free = next(i for i in range(pool.num_blocks) if pool.ref_count(i) == 0)
        b.block_table.append(free)
        return [f"bad running {b!r}", f"block {free}: ref count 0, tables 1"]
    if case == "waiting computed":
        w.num_computed_tokens = 1
        return [f"bad waiting {w!r}"]
    if case == "swapped holds a block":
        c.block_table = [b.block_table[0]]
        return [f"bad swapped {c!r}"]
    if case == "swapped slots":
        c.swap_slots = c.swap_slots + sched.swap_space.allocate(1)
        return [f"bad swapped {c!r}"]
    if case == "lost slot":
        sched.swap_space.allocate(1)
        used = sched.swap_space.num_used
        return [f"swapped seqs hold {used - 1} slots, {used} used"]
    if case == "order":
        sched.running.reverse()
        return ["running queue is out of priority order"]
    if case == "max_num_seqs":
        b.num_pending_forks = 3
        return ["5 running seqs > max_num_seqs"]
    if case == "max_tokens":
        a.max_output_tokens = 0
        return [f"{a!r} exceeds its length limits"]
    if case == "computed":
        w.num_computed_tokens = w.num_tokens
        return [f"bad waiting {w!r}", f"{w!r} computed every known token"]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["running status", "running holds a stray block",
                                  "waiting holds a block", "waiting computed",
                                  "swapped holds a block", "swapped slots", "lost slot", "order",
                                  "max_num_seqs", "max_tokens", "computed"])
def test_integrity_check_names_each_problem(rng: random.Random, case: str) -> None:
    sched, seqs = _running_and_swapped(rng)
    problems = _break(sched, *seqs, case)
    with pytest.raises(AssertionError) as err:
        sched.check_integrity()
    assert str(err.value) == "Scheduler integrity: " + "; ".join(problems)


def test_integrity_check_names_the_first_five_problems(rng: random.Random) -> None:
    sched, _ = _running_and_swapped(rng)
    waiting = [sched.add_request(f"x{i}", rand_prompt(rng, 3), SamplingParams())[0]
               for i in range(6)]
    for seq in waiting:
        seq.num_computed_tokens = 1
    with pytest.raises(AssertionError) as err:
        sched.check_integrity()
    assert str(err.value) == "Scheduler integrity: " + "; ".join(
        f"bad waiting {s!r}" for s in waiting[:5])
