"""Shared pieces of the scheduler tests: a fake KV cache that replays every SchedulerOutput and
checks each row sees exactly its own token history, and a fake sampler whose token depends only
on that history, so outputs must not depend on memory pressure."""

from __future__ import annotations

import hashlib
import random
from weakref import WeakKeyDictionary

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler, SchedulerOutput
from edge_llm.engine.sequence import Sequence
from edge_llm.sampling_params import SamplingParams

VOCAB = 1000  # fake sampler tokens are < VOCAB; stop ids used by tests are >= VOCAB


def fake_token(seq: Sequence, salt: int = 0) -> int:
    tail = seq.all_token_ids[-6:]
    data = f"{salt}|{seq.index}|{seq.num_tokens}|{tail}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little") % VOCAB


class FakeKV:
    """Token ids stored per (block, offset); checks every row sees its own history."""

    def __init__(self, sched: Scheduler) -> None:
        bs = self.bs = sched.block_size
        self.gpu = [[None] * bs for _ in range(sched.pool.num_blocks)]
        self.cpu = [[None] * bs for _ in range(sched.swap_space.num_cpu_blocks)]

    def run(self, out: SchedulerOutput) -> None:
        for g, c in out.blocks_to_swap_out:
            self.cpu[c] = list(self.gpu[g])
        for c, g in out.blocks_to_swap_in:
            self.gpu[g] = list(self.cpu[c])
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = list(self.gpu[src])
        bs = self.bs
        for r in out.scheduled:
            for i in range(r.num_scheduled_tokens):
                p = r.start_pos + i
                self.gpu[r.block_table[p // bs]][p % bs] = r.token_ids[i]
        for r in out.scheduled:
            end = r.start_pos + r.num_scheduled_tokens
            seen = [self.gpu[r.block_table[p // bs]][p % bs] for p in range(end)]
            assert seen == r.seq.all_token_ids[:end], f"wrong KV for {r.seq!r}"


def make(
    num_gpu_blocks: int,
    num_cpu_blocks: int = 0,
    block_size: int = 8,
    max_num_seqs: int = 8,
    budget: int = 64,
    max_model_len: int = 256,
    growth_reserve: int = 0,
    preemption_mode: str | None = "swap",
    max_tokens_with_decodes: int | None = None,
    **cache: bool,
) -> Scheduler:
    """A scheduler over a tiny pool. ``growth_reserve`` defaults to 0 and ``preemption_mode``
    to "swap" here so that memory pressure reaches the preemption paths these tests exercise
    (recompute whenever ``num_cpu_blocks`` is 0)."""
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
            growth_reserve=growth_reserve, preemption_mode=preemption_mode,
            max_tokens_with_decodes=max_tokens_with_decodes,
        ),
        CacheConfig(block_size=block_size, **cache),
        num_gpu_blocks,
        num_cpu_blocks,
    )


MAX_STEPS = 2000  # per scheduler: a test's `while ...: step()` loop fails instead of hanging
_steps: WeakKeyDictionary[Scheduler, int] = WeakKeyDictionary()


def count_step(sched: Scheduler) -> None:
    """Call once per step a test drives by hand."""
    _steps[sched] = _steps.get(sched, 0) + 1
    assert _steps[sched] <= MAX_STEPS, f"no progress after {MAX_STEPS} steps: {sched.stats()}"


def step(sched: Scheduler, kv: FakeKV) -> tuple[SchedulerOutput, list[Sequence]]:
    count_step(sched)
    out = sched.schedule()
    sched.check_integrity()
    assert all(r.num_scheduled_tokens > 0 for r in out.scheduled), "a row without tokens"
    assert out.num_batched_tokens == sum(r.num_scheduled_tokens for r in out.scheduled)
    assert out.num_batched_tokens <= sched.config.max_num_batched_tokens
    kv.run(out)
    sampled = {r.seq.seq_id: fake_token(r.seq) for r in out.scheduled if r.do_sample}
    got = sched.update_from_output(out, sampled)
    sched.check_integrity()
    return out, got


def drain(sched: Scheduler, kv: FakeKV, max_steps: int = 2000) -> list[SchedulerOutput]:
    outs = []
    while sched.has_unfinished():
        outs.append(step(sched, kv)[0])
        assert len(outs) <= max_steps, "no progress"
    assert sched.pool.num_free_blocks == sched.pool.num_blocks  # cached-free counts as free
    assert sched.swap_space.num_free == sched.swap_space.num_cpu_blocks
    return outs


def rand_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def outputs_of(seqs: list[Sequence]) -> dict[tuple[str, int], list[int]]:
    return {(s.request_id, s.index): list(s.output_token_ids) for s in seqs}


def reference_outputs(requests: list[tuple[str, list[int], SamplingParams, float]]) -> dict:
    sched = make(1000, budget=512, max_num_seqs=16)
    kv = FakeKV(sched)
    seqs = []
    for rid, prompt, params, arrival in requests:
        sched.add_request(rid, prompt, params, arrival)
    while sched.has_unfinished():
        seqs += step(sched, kv)[1]
    return outputs_of(seqs)
