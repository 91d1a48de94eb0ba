"""Scheduler under memory pressure: preemption by swap and by recompute, swap-in order, and
the CPU slots of one step (the fake KV cache replays every step's swaps and copies)."""

from __future__ import annotations

import random

import pytest

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler
from edge_llm.engine.sequence import Sequence, SequenceStatus
from edge_llm.sampling_params import SamplingParams
from tests.scheduler_helpers import (
    FakeKV,
    drain,
    make,
    outputs_of,
    rand_prompt,
    reference_outputs,
    step,
)


@pytest.mark.parametrize("num_cpu_blocks", [16, 0])  # swap, then recompute
def test_preemption_when_blocks_run_out(rng: random.Random, num_cpu_blocks: int) -> None:
    reqs = [
        ("a", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 0.0),
        ("b", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 1.0),
    ]
    sched = make(6, num_cpu_blocks=num_cpu_blocks, budget=32)  # each needs 4 blocks of 8
    kv = FakeKV(sched)
    a, b = (sched.add_request(*r)[0] for r in reqs)
    seqs: list[Sequence] = []
    while not sched.num_preemptions:
        table_b = list(b.block_table)
        out, got = step(sched, kv)
        seqs += got
    # a (older) needed a block for position 24: the most recently arrived b is the victim
    assert out.preempted_seq_ids == [b.seq_id] and a.num_computed_tokens == 25
    assert b.block_table == []
    if num_cpu_blocks:
        assert b.status is SequenceStatus.SWAPPED and sched.swapped == [b]
        assert [g for g, _ in out.blocks_to_swap_out] == table_b
        slots = [c for _, c in out.blocks_to_swap_out]
    else:
        assert b.status is SequenceStatus.WAITING and sched.waiting[0] is b
        assert b.num_computed_tokens == 0 and not out.blocks_to_swap_out
    resumed = None
    while sched.has_unfinished():
        out, got = step(sched, kv)
        seqs += got
        row = next((r for r in out.scheduled if r.seq is b), None)
        if resumed is None and row is not None:
            resumed = out
            if num_cpu_blocks:
                assert [c for c, _ in out.blocks_to_swap_in] == slots
                assert [g for _, g in out.blocks_to_swap_in] == b.block_table[: len(slots)]
                assert (row.start_pos, row.num_scheduled_tokens) == (24, 1)
                assert b.swap_slots == [] and sched.swap_space.num_used == 0
            else:  # prompt + outputs so far are the new prefill; full blocks hit the cache
                assert row.start_pos == b.num_cached_tokens + 16 == 16
                assert row.token_ids == b.all_token_ids[16:25] and row.do_sample
    assert resumed is not None and a.is_finished and b.is_finished
    assert sched.stats()["num_preemptions"] == 1 and b.num_preemptions == 1
    assert outputs_of(seqs) == reference_outputs(reqs)
    assert sched.pool.num_free_blocks == 6


def test_recompute_without_prefix_cache_restarts_at_zero(rng: random.Random) -> None:
    sched = make(6, budget=32, enable_prefix_caching=False)
    kv = FakeKV(sched)
    sched.add_request("a", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 0.0)
    (b,) = sched.add_request("b", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 1.0)
    while not sched.num_preemptions:
        step(sched, kv)
    row = None
    while row is None:
        out = step(sched, kv)[0]
        row = next((r for r in out.scheduled if r.seq is b), None)
    assert (row.start_pos, row.num_scheduled_tokens) == (0, 25) and row.token_ids == (
        b.prompt_token_ids + b.output_token_ids[:-1]  # the last one was sampled this step
    )
    drain(sched, kv)


def test_swapped_come_back_before_new_admissions(rng: random.Random) -> None:
    sched = make(6, num_cpu_blocks=16, budget=32)
    kv = FakeKV(sched)
    sched.add_request("a", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 0.0)
    (b,) = sched.add_request("b", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 1.0)
    while b.status is not SequenceStatus.SWAPPED:
        step(sched, kv)
    (c,) = sched.add_request("c", rand_prompt(rng, 4), SamplingParams(max_tokens=2), 2.0)
    swap_in_step = admit_step = None
    for i in range(200):
        out, _ = step(sched, kv)
        if out.blocks_to_swap_in and swap_in_step is None:
            swap_in_step = i
        if any(r.seq is c for r in out.scheduled) and admit_step is None:
            admit_step = i
        if b.status is SequenceStatus.SWAPPED:
            assert c.status is SequenceStatus.WAITING  # c's one block would have fit
        if not sched.has_unfinished():
            break
    assert swap_in_step is not None and admit_step is not None and swap_in_step <= admit_step
    assert sched.pool.num_free_blocks == 6


def test_slots_freed_by_swap_in_are_not_reused_in_the_same_step(rng: random.Random) -> None:
    """White-box: the runner applies swap-out before swap-in, so a slot freed by this step's
    swap-in must not receive this step's swap-out. State: P and V mid-prefill, S swapped."""
    sched = make(5, num_cpu_blocks=4, budget=16, max_num_seqs=4)
    kv = FakeKV(sched)
    p, s, v = (
        sched.add_request(rid, rand_prompt(rng, n), SamplingParams(max_tokens=4), t)[0]
        for rid, n, t in (("p", 24, 0.0), ("s", 9, 1.0), ("v", 24, 2.0))
    )
    sched.waiting.clear()
    for seq, computed in ((p, 16), (v, 8)):
        seq.block_table = sched.pool.allocate(computed // 8)
        seq.num_computed_tokens = computed
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
        for i, b in enumerate(seq.block_table):
            kv.gpu[b] = seq.all_token_ids[8 * i : 8 * i + 8]
    s.num_computed_tokens, s.status = 8, SequenceStatus.SWAPPED
    s.swap_slots = sched.swap_space.allocate(1)
    kv.cpu[s.swap_slots[0]] = s.all_token_ids[:8]
    sched.swapped.append(s)
    sched.check_integrity()  # the hand-made state is a legal one
    out = sched.schedule()
    # S comes back (2 blocks: its data + position 8); P then finds no free block and
    # preempts V, the most recently arrived unscheduled sequence, into a different slot
    assert [r.seq.request_id for r in out.scheduled] == ["s", "p"]
    assert out.preempted_seq_ids == [v.seq_id] and v.status is SequenceStatus.SWAPPED
    (slot_in, _), (_, slot_out) = out.blocks_to_swap_in[0], out.blocks_to_swap_out[0]
    assert slot_in != slot_out
    kv.run(out)
    sched.update_from_output(out, {r.seq.seq_id: 1 for r in out.scheduled if r.do_sample})
    sched.check_integrity()
    drain(sched, kv)


def test_growth_reserve_holds_back_admissions(rng: random.Random) -> None:
    # 12 blocks of 8: a and b need 4 blocks each at the end (12-token prompt + 20 outputs).
    # With no reserve both start at once (2 + 2 blocks) and one is preempted as they grow;
    # a reserve of 20 tokens keeps b waiting until a's 4 blocks plus b's fit, and nothing
    # is preempted.
    reqs = [(r, rand_prompt(rng, 12), SamplingParams(max_tokens=20, ignore_eos=True), t)
            for r, t in (("a", 0.0), ("b", 1.0), ("c", 2.0))]
    outs = {}
    for reserve in (0, 20):
        sched = make(10, budget=64, growth_reserve=reserve)
        kv = FakeKV(sched)
        for r in reqs:
            sched.add_request(*r)
        first, _ = step(sched, kv)
        admitted = sorted(s.seq.request_id for s in first.scheduled)
        seqs = []
        while sched.has_unfinished():
            seqs += step(sched, kv)[1]
        outs[reserve] = (admitted, sched.num_preemptions, outputs_of(seqs))
    assert outs[0][0] == ["a", "b", "c"] and outs[0][1] > 0
    # a: 2 blocks now + 2 of growth; b would add 2 + 2 more: 8 of 10 fit, c's 4 more do not
    assert outs[20][0] == ["a", "b"] and outs[20][1] == 0
    assert outs[20][2] == outs[0][2] == reference_outputs(reqs)


def test_growth_reserve_is_capped_by_max_tokens_and_waived_when_idle(rng) -> None:
    # max_tokens 4: the reserve of 1,000 tokens counts only 4 more per sequence
    reqs = [(r, rand_prompt(rng, 16), SamplingParams(max_tokens=4, ignore_eos=True), t)
            for r, t in (("a", 0.0), ("b", 1.0))]
    sched = make(6, budget=64, growth_reserve=1000)
    kv = FakeKV(sched)
    for r in reqs:
        sched.add_request(*r)
    out, _ = step(sched, kv)
    assert sorted(s.seq.request_id for s in out.scheduled) == ["a", "b"]  # 3 + 3 blocks
    drain(sched, kv)
    # one request whose own reserve exceeds the free blocks still starts on an idle engine
    sched = make(5, budget=64, growth_reserve=1000)
    kv = FakeKV(sched)
    sched.add_request("x", rand_prompt(rng, 16), SamplingParams(max_tokens=24), 0.0)
    out, _ = step(sched, kv)
    assert [s.seq.request_id for s in out.scheduled] == ["x"]
    drain(sched, kv)


def test_growth_reserve_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="growth_reserve"):
        SchedulerConfig(growth_reserve=-1)


def test_default_preemption_recomputes_lone_sequences(rng: random.Random) -> None:
    # as test_preemption_when_blocks_run_out, with swap space but preemption_mode None: the
    # lone victim b is recomputed, and the swap space stays empty
    reqs = [
        ("a", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 0.0),
        ("b", rand_prompt(rng, 12), SamplingParams(max_tokens=20), 1.0),
    ]
    sched = make(6, num_cpu_blocks=16, budget=32, preemption_mode=None)
    kv = FakeKV(sched)
    a, b = (sched.add_request(*r)[0] for r in reqs)
    seqs: list[Sequence] = []
    while not sched.num_preemptions:
        out, got = step(sched, kv)
        seqs += got
    assert out.preempted_seq_ids == [b.seq_id] and not out.blocks_to_swap_out
    assert b.status is SequenceStatus.WAITING and sched.swap_space.num_free == 16
    while sched.has_unfinished():
        seqs += step(sched, kv)[1]
    assert outputs_of(seqs) == reference_outputs(reqs)


def test_default_preemption_swaps_siblings(rng: random.Random) -> None:
    # n = 2: the two siblings share the prompt's blocks; the younger one is swapped out
    reqs = [("x", rand_prompt(rng, 12), SamplingParams(n=2, max_tokens=30), 0.0)]
    sched = make(7, num_cpu_blocks=16, budget=32, preemption_mode=None)
    kv = FakeKV(sched)
    sched.add_request(*reqs[0])
    seqs: list[Sequence] = []
    while not sched.num_preemptions:
        out, got = step(sched, kv)
        seqs += got
    (victim,) = [s for s in sched.sequences_of("x") if s.seq_id in out.preempted_seq_ids]
    assert victim.status is SequenceStatus.SWAPPED and out.blocks_to_swap_out
    while sched.has_unfinished():
        seqs += step(sched, kv)[1]
    assert outputs_of(seqs) == reference_outputs(reqs)


def test_preemption_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="preemption_mode"):
        SchedulerConfig(preemption_mode="evict")


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("prompt_len", [16, 18])  # 1 or 7 positions left in the last block
def test_swapped_sequence_returns_into_exactly_its_blocks(rng: random.Random, chunked: bool,
                                                         prompt_len: int) -> None:
    """n = 3 on a cache of exactly the prompt's blocks: after the fork, siblings 1 and 2 are
    swapped out. Each comes back as soon as its own blocks are free, since its next token fits
    in its last block, also when one position is left and without chunked prefill."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32,
                                      max_model_len=prompt_len + 1,
                                      enable_chunked_prefill=chunked, growth_reserve=0),
                      CacheConfig(block_size=8), -(-prompt_len // 8), 8)
    kv = FakeKV(sched)
    sched.add_request("r", rand_prompt(rng, prompt_len), SamplingParams(n=3, max_tokens=1))
    step(sched, kv)  # the prefill and the fork
    out, _ = step(sched, kv)
    first, *others = sched.sequences_of("r")
    assert [r.seq for r in out.scheduled] == [first] and sched.swapped == others
    for seq in others:  # the sibling before it finished and freed every block
        assert sched.pool.num_free_blocks == sched.pool.num_blocks
        out, _ = step(sched, kv)
        assert len(out.blocks_to_swap_in) == sched.pool.num_blocks
        assert [(r.seq, r.start_pos, r.num_scheduled_tokens) for r in out.scheduled] == [
            (seq, prompt_len - 1, 1)]
    assert not sched.has_unfinished()


def test_swap_in_takes_the_budget_the_decodes_leave(rng: random.Random) -> None:
    """With max_tokens_with_decodes = 2, a's decode leaves one token of the step: the first
    swapped sibling comes back with it and the other two wait (no row without a token)."""
    sched = make(6, num_cpu_blocks=64, max_num_seqs=5, budget=16, max_tokens_with_decodes=2)
    kv = FakeKV(sched)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    (a,) = sched.add_request("a", rand_prompt(rng, 5), params, 0.0)
    (z,) = sched.add_request("z", rand_prompt(rng, 16), SamplingParams(max_tokens=2), 1.0)
    sched.add_request("s", rand_prompt(rng, 9), SamplingParams(max_tokens=10, n=3), 2.0)
    while len(sched.swapped) < 3:
        step(sched, kv)
    assert z.is_finished and sched.running == [a]
    first, *others = sched.sequences_of("s")
    out, _ = step(sched, kv)
    assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(a, 1), (first, 1)]
    assert sched.swapped == others
    drain(sched, kv)


def test_swapped_prefill_comes_back_with_the_chunk_that_fits(rng: random.Random) -> None:
    """p is swapped out mid-prefill. Its 3 blocks and one more are free: it comes back with
    the 8 positions of that block rather than waiting for room for 11 (chunked prefill)."""
    sched = make(6, num_cpu_blocks=64, max_num_seqs=4, budget=12)
    kv = FakeKV(sched)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    (a,) = sched.add_request("a", rand_prompt(rng, 5), SamplingParams(max_tokens=40), 0.0)
    sched.add_request("z", rand_prompt(rng, 8), params, 1.0)
    (p,) = sched.add_request("p", rand_prompt(rng, 40), params, 2.0)
    while not sched.swapped:
        step(sched, kv)
    assert sched.swapped == [p] and p.num_computed_tokens == 24
    assert len(p.swap_slots) == 3 and sched.pool.num_free_blocks == 4
    out, _ = step(sched, kv)
    assert [(r.seq, r.start_pos, r.num_scheduled_tokens) for r in out.scheduled] == [
        (a, 9, 1), (p, 24, 8)]
    drain(sched, kv)


@pytest.mark.parametrize("running", [2, 3])
def test_a_swapped_sequence_returns_into_the_last_free_seat(rng: random.Random,
                                                            running: int) -> None:
    """max_num_seqs counts seats: with 3 and 2 sequences running, the swapped one comes back
    (2 + 1 = 3); with 3 running it waits."""
    sched = make(8, num_cpu_blocks=4, budget=16, max_num_seqs=3)
    seqs = [sched.add_request(f"r{i}", rand_prompt(rng, 9), SamplingParams(max_tokens=4),
                              float(i))[0] for i in range(running + 1)]
    *runners, s = seqs
    sched.waiting.clear()
    for seq in runners:
        seq.block_table = sched.pool.allocate(1)
        seq.num_computed_tokens = 8
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
    s.num_computed_tokens, s.status = 8, SequenceStatus.SWAPPED
    s.swap_slots = sched.swap_space.allocate(1)
    sched.swapped.append(s)
    sched.check_integrity()  # the hand-made state is a legal one
    out = sched.schedule()
    back = running + 1 <= 3
    assert (s in [r.seq for r in out.scheduled]) is back
    assert s.status is (SequenceStatus.RUNNING if back else SequenceStatus.SWAPPED)
    assert len(out.scheduled) == min(running + 1, 3)
