"""Scheduler policy and bookkeeping, through the public API only: which sequence is preempted,
the order in which a finished request's blocks leave the prefix cache, no swap-in in a step
that preempted, block registration the step a block fills, stop ids at ``min_tokens``, the
growth-reserve waiver on an idle engine, n > 1 requests living until their last sibling, finished
ids and mid-step aborts, pending forks taking seats, prefill chunks shrinking under pressure."""

from __future__ import annotations

import random

import pytest

from edge_llm.engine.scheduler import Scheduler
from edge_llm.engine.sequence import Sequence, SequenceStatus
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

BS = 8


def scripted_step(sched: Scheduler, kv: FakeKV, script: dict[str, list[int]]):
    """One step whose sampled token is ``script[request_id][number of outputs so far]``."""
    count_step(sched)
    out = sched.schedule()
    sched.check_integrity()
    kv.run(out)
    sampled = {r.seq.seq_id: script[r.seq.request_id][r.seq.num_output_tokens]
               for r in out.scheduled if r.do_sample}
    got = sched.update_from_output(out, sampled)
    sched.check_integrity()
    return out, got


# ---- preemption: the newest running sequence not yet scheduled in the step goes first -------


def three_running(rng: random.Random, lengths: tuple[int, int, int]) -> tuple:
    """a, b, c (arriving in that order) prefilled in one step on a pool with no block to spare;
    a prompt of 8 tokens needs a new block for its first decode, one of 9 does not."""
    blocks = sum(-(-n // BS) for n in lengths)
    sched = make(blocks, num_cpu_blocks=0, block_size=BS, budget=64)
    kv = FakeKV(sched)
    seqs = [sched.add_request(rid, rand_prompt(rng, n), SamplingParams(max_tokens=20), t)[0]
            for rid, n, t in zip("abc", lengths, (0.0, 1.0, 2.0), strict=True)]
    out, _ = step(sched, kv)
    assert [r.seq for r in out.scheduled] == seqs and sched.pool.num_free_blocks == 0
    return sched, kv, seqs


def test_oldest_decode_preempts_the_newest(rng: random.Random) -> None:
    sched, kv, (a, b, c) = three_running(rng, (8, 9, 9))
    out, _ = step(sched, kv)  # a needs a block: c, not b, gives its blocks up
    assert out.preempted_seq_ids == [c.seq_id]
    assert [r.seq for r in out.scheduled] == [a, b]
    assert c.status is SequenceStatus.WAITING and c.num_preemptions == 1
    assert b.num_preemptions == 0 and b.block_table
    drain(sched, kv)


def test_middle_decode_preempts_the_newest(rng: random.Random) -> None:
    sched, kv, (a, b, c) = three_running(rng, (9, 8, 9))
    out, _ = step(sched, kv)  # b needs a block: c (newer, unscheduled) goes, a keeps its own
    assert out.preempted_seq_ids == [c.seq_id]
    assert [r.seq for r in out.scheduled] == [a, b] and a.num_preemptions == 0
    drain(sched, kv)


def test_newest_decode_without_victim_preempts_itself(rng: random.Random) -> None:
    sched, kv, (a, b, c) = three_running(rng, (9, 9, 8))
    out, _ = step(sched, kv)  # a and b already ran this step: c cannot take their blocks
    assert out.preempted_seq_ids == [c.seq_id]
    assert [r.seq for r in out.scheduled] == [a, b]
    assert a.num_preemptions == b.num_preemptions == 0
    drain(sched, kv)


# ---- a finished request's blocks: its last block is evicted first --------------------------


@pytest.mark.parametrize("ending", ["length", "abort"])
def test_finished_prefix_loses_its_last_block_first(rng: random.Random, ending: str) -> None:
    """a's prompt fills 3 blocks (plus 1 token). After a ends, b takes every free block and one
    cached block: that must be a's third, so c (a's prompt again) still hits a's first two."""
    sched = make(6, block_size=BS, budget=64, enable_prefix_caching=True)
    kv = FakeKV(sched)
    prompt = rand_prompt(rng, 3 * BS + 1)
    max_tokens = 1 if ending == "length" else 5
    (a,) = sched.add_request("a", prompt, SamplingParams(max_tokens=max_tokens), 0.0)
    step(sched, kv)
    if ending == "abort":
        assert sched.abort("a") == [a]
    assert a.is_finished and sched.pool.num_cached_blocks == 3
    (b,) = sched.add_request("b", rand_prompt(rng, 4 * BS - 3), SamplingParams(max_tokens=2), 1.0)
    (c,) = sched.add_request("c", list(prompt), SamplingParams(max_tokens=2), 2.0)
    out, _ = step(sched, kv)
    assert [r.seq for r in out.scheduled] == [b]
    assert sched.pool.num_cached_blocks == 2 + b.num_registered_blocks
    drain(sched, kv)
    assert c.num_cached_tokens == 2 * BS
    stats = sched.stats()
    assert (stats["prefix_queries"], stats["prefix_hits"]) == (2 * len(prompt) + 4 * BS - 3,
                                                                2 * BS)


# ---- swap-in waits for a step without preemptions ------------------------------------------


def test_no_swap_in_in_a_step_that_preempted(rng: random.Random) -> None:
    """A workload (found by search) in which a recompute-preemption frees enough blocks for a
    swapped sibling to come back at once; it must wait for the next step."""
    reqs = [(f"r{i}", rand_prompt(rng, n), SamplingParams(max_tokens=m, n=2, ignore_eos=True),
             float(i)) for i, (n, m) in enumerate([(2, 17), (7, 33), (7, 3), (9, 18)])]
    sched = make(5, num_cpu_blocks=3, block_size=BS, max_num_seqs=5, budget=64,
                 preemption_mode=None)
    kv = FakeKV(sched)
    for r in reqs:
        sched.add_request(*r)
    seqs: list[Sequence] = []
    preempted = swapped_in = n_preempted = 0
    while sched.has_unfinished():
        out, got = step(sched, kv)
        seqs += got
        n_preempted += len(out.preempted_seq_ids)
        assert not (out.preempted_seq_ids and out.blocks_to_swap_in), "swap-in after preempting"
        preempted += bool(out.preempted_seq_ids)
        swapped_in += bool(out.blocks_to_swap_in)
    assert preempted and swapped_in
    assert outputs_of(seqs) == reference_outputs(reqs)
    assert sched.num_preemptions == sched.stats()["num_preemptions"] == n_preempted


def test_swapped_siblings_come_back_together(rng: random.Random) -> None:
    """Both swapped siblings of a request return in the same step once there is room."""
    sched = make(6, num_cpu_blocks=16, block_size=BS, max_num_seqs=3, budget=64)
    kv = FakeKV(sched)
    sched.add_request("a", rand_prompt(rng, 16), SamplingParams(max_tokens=17), 0.0)
    n0 = sched.add_request("n", rand_prompt(rng, 9), SamplingParams(max_tokens=20, n=2), 1.0)[0]
    while len(sched.swapped) < 2:
        step(sched, kv)
    pool, swap = sched.pool, sched.swap_space
    assert sched.stats() == {
        "num_running": 1, "num_waiting": 0, "num_swapped": 2, "num_unfinished_requests": 2,
        "num_preemptions": 2, "prefix_queries": 16 + 9, "prefix_hits": 0,
        "kv_cache_usage": pool.usage, "cpu_swap_usage": swap.usage,
        "num_free_blocks": pool.num_free_blocks,
    }
    assert 0 < swap.usage < 1 and pool.num_free_blocks < 6
    while sched.swapped:
        out, _ = step(sched, kv)
        assert not out.blocks_to_swap_in or not sched.swapped  # all at once or none
    assert sched.running == sched.sequences_of("n") and sched.running[0] is n0
    assert {r.seq for r in out.scheduled} == set(sched.running)
    drain(sched, kv)


def test_three_swapped_siblings_come_back_together(rng: random.Random) -> None:
    """n = 3 is swapped out while a runs; once a ends, all three return in one step, taking
    three of the four seats."""
    sched = make(4, num_cpu_blocks=16, block_size=BS, max_num_seqs=4, budget=64)
    kv = FakeKV(sched)
    sched.add_request("a", rand_prompt(rng, 16), SamplingParams(max_tokens=3, ignore_eos=True),
                      0.0)
    sched.add_request("n", rand_prompt(rng, 8), SamplingParams(max_tokens=10, n=3,
                                                               ignore_eos=True), 1.0)
    while len(sched.swapped) < 3:
        step(sched, kv)
    while sched.swapped:
        out, _ = step(sched, kv)
        assert not out.blocks_to_swap_in or not sched.swapped  # all at once or none
    assert sched.running == sched.sequences_of("n")
    assert {r.seq for r in out.scheduled} == set(sched.running)
    drain(sched, kv)


# ---- prefix-cache registration: the step a block becomes full ------------------------------


def test_block_is_registered_the_step_it_fills(rng: random.Random) -> None:
    sched = make(20, block_size=BS, budget=64, enable_prefix_caching=True)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, BS - 3), SamplingParams(max_tokens=30), 0.0)
    for _ in range(2 * BS):
        step(sched, kv)
        # every block whose last position was computed in this step is already indexed
        assert sched.pool.num_cached_blocks == a.num_computed_tokens // BS
        assert a.num_registered_blocks == a.num_computed_tokens // BS
    # a prompt equal to a's tokens so far hits every full block at once
    prefix = a.all_token_ids[: 2 * BS + 1]
    (b,) = sched.add_request("b", prefix, SamplingParams(max_tokens=1), 1.0)
    out, _ = step(sched, kv)
    row = next(r for r in out.scheduled if r.seq is b)
    assert row.start_pos == b.num_cached_tokens == 2 * BS
    drain(sched, kv)


# ---- stop ids: the min_tokens-th token may already stop ------------------------------------


@pytest.mark.parametrize("min_tokens", [1, 3])
def test_stop_id_at_the_min_tokens_th_token_stops(rng: random.Random, min_tokens: int) -> None:
    eos, stop = VOCAB + 1, VOCAB + 2
    params = SamplingParams(max_tokens=10, min_tokens=min_tokens, stop_token_ids=[stop])
    params.all_stop_token_ids |= {eos}  # what the engine adds before add_request
    sched = make(20, block_size=BS)
    kv = FakeKV(sched)
    script = {"s": [stop] * (min_tokens - 1) + [stop, 7, stop],
              "e": [eos] * (min_tokens - 1) + [eos, 7, eos]}
    seqs = {rid: sched.add_request(rid, rand_prompt(rng, 5), params)[0] for rid in script}
    while sched.has_unfinished():
        scripted_step(sched, kv, script)
    assert [seqs["s"].output_token_ids, seqs["s"].finish_reason, seqs["s"].stop_reason] == [
        [stop] * min_tokens, "stop", stop]
    assert [seqs["e"].output_token_ids, seqs["e"].finish_reason, seqs["e"].stop_reason] == [
        [eos] * min_tokens, "stop", None]


# ---- growth reserve: waived while nothing runs ---------------------------------------------


def test_idle_engine_admits_a_request_its_reserve_would_hold_back(rng: random.Random) -> None:
    """Prompt 8 + 25 outputs need 4 blocks (the last output's KV is never stored): the cache
    holds exactly that. The reserve counts one block more (8 + 25 tokens), which never frees,
    so only the waiver lets the request start, and it runs to its end without preemption."""
    sched = make(4, block_size=BS, budget=64, growth_reserve=1000)
    kv = FakeKV(sched)
    (x,) = sched.add_request("x", rand_prompt(rng, BS), SamplingParams(max_tokens=25,
                                                                        ignore_eos=True), 0.0)
    out, _ = step(sched, kv)
    assert [r.seq for r in out.scheduled] == [x]
    drain(sched, kv, max_steps=30)
    assert x.num_output_tokens == 25 and x.finish_reason == "length"
    assert sched.num_preemptions == 0


# ---- n > 1: a request lives until its last sibling ends ------------------------------------


@pytest.mark.parametrize("first_end", ["finish", "stop_id"])
def test_request_outlives_its_first_finished_sibling(rng: random.Random, first_end: str) -> None:
    stop = VOCAB + 2
    sched = make(40, block_size=BS, max_num_seqs=4)
    kv = FakeKV(sched)
    params = SamplingParams(n=3, max_tokens=20, stop_token_ids=[stop], seed=1)
    sched.add_request("r", rand_prompt(rng, 12), params, 0.0)
    script = {"r": [5] * 20}
    while len(sched.sequences_of("r")) < 3:
        scripted_step(sched, kv, script)
    first, *others = sched.sequences_of("r")
    if first_end == "finish":
        sched.finish(first, SequenceStatus.FINISHED_STOPPED, stop_reason="###")
    else:
        while not first.is_finished:  # only the first sibling samples the stop id
            count_step(sched)
            out = sched.schedule()
            kv.run(out)
            sampled = {r.seq.seq_id: stop if r.seq is first else 5
                       for r in out.scheduled if r.do_sample}
            sched.update_from_output(out, sampled)
            sched.check_integrity()
    assert first.finish_reason == "stop" and not any(s.is_finished for s in others)
    assert sched.num_unfinished_requests == 1 and sched.sequences_of("r")[0] is first
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request("r", [1, 2], SamplingParams())
    # abort reaches every sibling still running, and only then is the request gone
    assert sched.abort("r") == others
    assert all(s.status is SequenceStatus.FINISHED_ABORTED for s in others)
    assert sched.num_unfinished_requests == 0 and sched.sequences_of("r") == []
    assert not sched.has_unfinished() and sched.pool.num_free_blocks == 40
    sched.check_integrity()
    sched.add_request("r", [1, 2], SamplingParams())  # the id is free again


# ---- growth reserve: what a sequence may still need ----------------------------------------


def test_reserve_counts_only_the_outputs_left(rng: random.Random) -> None:
    """a (8-token prompt, max_tokens 16) has 15 outputs: its 3 blocks hold all it will still
    store, so it reserves nothing, and b (1 block + 1 of its own growth) fits the 2 free
    blocks. Counting a's 16-token horizon past its max_tokens would hold b back."""
    sched = make(5, block_size=BS, budget=64, growth_reserve=16)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, BS), SamplingParams(max_tokens=16,
                                                                        ignore_eos=True), 0.0)
    for _ in range(15):
        step(sched, kv)
    assert a.num_output_tokens == 15 and sched.pool.num_free_blocks == 2
    (b,) = sched.add_request("b", rand_prompt(rng, BS), SamplingParams(max_tokens=1), 1.0)
    out, _ = step(sched, kv)
    assert [r.seq for r in out.scheduled] == [a, b]
    drain(sched, kv)


@pytest.mark.parametrize("n, admitted_at", [(1, 2), (3, 3)])
def test_reserve_of_a_request_counts_each_sibling(rng: random.Random, n: int,
                                                  admitted_at: int) -> None:
    """c's growth of 8 tokens needs 2 blocks per sequence (its prompt's last token is fed after
    the fork): 6 for n = 3, more than the 6 free blocks leave after c's first block, so c waits
    for a to end; with n = 1 the same request starts beside a."""
    sched = make(8, block_size=BS, budget=64, growth_reserve=8)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, BS), SamplingParams(max_tokens=2,
                                                                        ignore_eos=True), 0.0)
    step(sched, kv)
    (c,) = sched.add_request("c", rand_prompt(rng, BS + 1),
                             SamplingParams(max_tokens=8, n=n, ignore_eos=True), 1.0)
    started = None
    for number in (2, 3):
        out, _ = step(sched, kv)
        if started is None and any(r.seq is c for r in out.scheduled):
            started = number
    assert started == admitted_at
    assert sched.num_preemptions == 0
    drain(sched, kv)


# ---- prefix hits leave the last prompt token to compute ------------------------------------


@pytest.mark.parametrize("length, hit", [(2 * BS, BS), (2 * BS + 1, 2 * BS), (BS + 1, BS),
                                         (BS, 0)])
def test_prefix_hit_always_leaves_the_last_token(rng: random.Random, length: int,
                                                 hit: int) -> None:
    """The row of the last prompt token is sampled, so it is computed even when its block is
    cached: a prompt of exactly two cached blocks reuses one."""
    sched = make(20, block_size=BS, budget=64, enable_prefix_caching=True)
    kv = FakeKV(sched)
    prompt = rand_prompt(rng, length)
    sched.add_request("first", prompt + rand_prompt(rng, BS), SamplingParams(max_tokens=1))
    drain(sched, kv)
    (again,) = sched.add_request("again", list(prompt), SamplingParams(max_tokens=1))
    out, _ = step(sched, kv)
    assert again.num_cached_tokens == hit
    assert (out.scheduled[0].start_pos, out.scheduled[0].num_scheduled_tokens) == (
        hit, length - hit)
    drain(sched, kv)


# ---- bookkeeping around a step -------------------------------------------------------------


def test_finished_ids_reach_the_runner_with_the_next_step(rng: random.Random) -> None:
    sched = make(10, block_size=BS)
    kv = FakeKV(sched)
    a, b = (sched.add_request(rid, rand_prompt(rng, 3), SamplingParams(max_tokens=5))[0]
            for rid in "ab")
    sched.abort("a")  # before the first step
    out, _ = step(sched, kv)
    assert out.finished_seq_ids == [a.seq_id] and [r.seq for r in out.scheduled] == [b]
    sched.abort("b")
    assert sched.schedule().finished_seq_ids == [b.seq_id]
    assert sched.schedule().finished_seq_ids == []


def test_a_row_aborted_mid_step_does_not_hold_back_the_others(rng: random.Random) -> None:
    sched = make(10, block_size=BS)
    kv = FakeKV(sched)
    a, b = (sched.add_request(rid, rand_prompt(rng, 3), SamplingParams(max_tokens=5), t)[0]
            for rid, t in (("a", 0.0), ("b", 1.0)))
    step(sched, kv)
    out = sched.schedule()
    assert [r.seq for r in out.scheduled] == [a, b]
    sched.abort("a")  # between schedule and update: its row is skipped, b's is not
    kv.run(out)
    assert sched.update_from_output(out, {a.seq_id: 1, b.seq_id: 2}) == [b]
    assert b.output_token_ids[-1] == 2 and b.num_computed_tokens == 4
    sched.check_integrity()


def test_pending_forks_count_against_max_num_seqs(rng: random.Random) -> None:
    """n = 3 while its prompt is prefilled in chunks: one sequence, three seats; x waits."""
    sched = make(40, block_size=BS, budget=BS, max_num_seqs=3)
    kv = FakeKV(sched)
    (parent,) = sched.add_request("r", rand_prompt(rng, 12), SamplingParams(n=3, max_tokens=3))
    step(sched, kv)
    (x,) = sched.add_request("x", rand_prompt(rng, 2), SamplingParams(max_tokens=3))
    out, _ = step(sched, kv)  # the last 3 prompt tokens, and budget to spare for x
    assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(parent, 3)]
    assert x.status is SequenceStatus.WAITING
    drain(sched, kv)


# ---- memory pressure: a prefill chunk shrinks to the room left ------------------------------


@pytest.mark.parametrize("first_prompt", [15, 9])
def test_prefill_chunk_shrinks_to_the_free_positions(rng: random.Random,
                                                     first_prompt: int) -> None:
    """a takes 2 blocks, b the last one with part of its prompt. Next step a decodes into its
    own block and b's chunk is cut to the positions left in b's block (7 or 1), not dropped."""
    sched = make(3, block_size=BS, budget=16, max_num_seqs=2)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, first_prompt), SamplingParams(max_tokens=2),
                             0.0)
    (b,) = sched.add_request("b", rand_prompt(rng, 20), SamplingParams(max_tokens=2), 1.0)
    out, _ = step(sched, kv)
    room = first_prompt - BS
    assert [r.num_scheduled_tokens for r in out.scheduled] == [first_prompt, BS - room]
    assert sched.pool.num_free_blocks == 0
    out, _ = step(sched, kv)
    assert [(r.seq, r.num_scheduled_tokens) for r in out.scheduled] == [(a, 1), (b, room)]
    assert not out.preempted_seq_ids
    drain(sched, kv)


def test_each_sequence_counts_its_own_preemptions(rng: random.Random) -> None:
    """The per-sequence counts (reported in a request's metrics) add up to the total."""
    reqs = [(f"r{i}", rand_prompt(rng, n), SamplingParams(max_tokens=m, ignore_eos=True),
             float(i)) for i, (n, m) in enumerate([(8, 40), (9, 40), (9, 40), (3, 40)])]
    sched = make(8, block_size=BS, budget=64)
    kv = FakeKV(sched)
    seqs = [sched.add_request(*r)[0] for r in reqs]
    drain(sched, kv)
    counts = [s.num_preemptions for s in seqs]
    assert max(counts) >= 2 and sum(counts) == sched.num_preemptions


def test_default_preemption_swaps_a_parent_before_its_fork(rng: random.Random) -> None:
    """n = 2, preempted during its chunked prefill: its one pending sibling makes it a swap."""
    sched = make(3, num_cpu_blocks=8, block_size=BS, budget=24, preemption_mode=None)
    kv = FakeKV(sched)
    (a,) = sched.add_request("a", rand_prompt(rng, 16), SamplingParams(max_tokens=5), 0.0)
    (p,) = sched.add_request("p", rand_prompt(rng, 20), SamplingParams(n=2, max_tokens=2), 1.0)
    step(sched, kv)
    assert p.num_computed_tokens == BS and p.num_pending_forks == 1
    out, _ = step(sched, kv)  # a's first decode needs a block: p is the victim
    assert out.preempted_seq_ids == [p.seq_id] and p.status is SequenceStatus.SWAPPED
    drain(sched, kv)
