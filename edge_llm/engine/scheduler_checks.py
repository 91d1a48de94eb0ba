"""Scheduler invariants, checked by tests after every scenario and by the engine when idle."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .scheduler_output import cdiv, priority
from .sequence import SequenceStatus

if TYPE_CHECKING:
    from .scheduler import Scheduler

_RUNNING = SequenceStatus.RUNNING
_WAITING = SequenceStatus.WAITING
_SWAPPED = SequenceStatus.SWAPPED


def check_scheduler_integrity(sched: Scheduler) -> None:
    """Pool and swap checks, plus: every ref count equals the number of tables holding the
    block, queues match statuses, tables cover the computed positions, limits hold.
    O(blocks + tokens). Raises AssertionError naming the first problems."""
    sched.pool.check_integrity()
    sched.swap_space.check_integrity()
    bs, cfg, errors = sched.block_size, sched.config, []
    refs: Counter[int] = Counter()
    for seq in sched.running:
        refs.update(seq.block_table)
        lo, hi = cdiv(seq.num_computed_tokens, bs), cdiv(seq.num_tokens, bs)
        if seq.status is not _RUNNING or not lo <= len(seq.block_table) <= hi:
            errors.append(f"bad running {seq!r}")
    for seq in sched.waiting:
        if seq.status is not _WAITING or seq.block_table or seq.num_computed_tokens:
            errors.append(f"bad waiting {seq!r}")
    for seq in sched.swapped:
        if (
            seq.status is not _SWAPPED
            or seq.block_table
            or (len(seq.swap_slots) != cdiv(seq.num_computed_tokens, bs))
        ):
            errors.append(f"bad swapped {seq!r}")
    num_slots = sum(len(s.swap_slots) for s in sched.swapped)
    if num_slots != sched.swap_space.num_used:
        errors.append(f"swapped seqs hold {num_slots} slots, {sched.swap_space.num_used} used")
    wrong = [b for b in range(sched.pool.num_blocks) if sched.pool.ref_count(b) != refs[b]]
    if wrong:
        b = wrong[0]
        errors.append(f"block {b}: ref count {sched.pool.ref_count(b)}, tables {refs[b]}")
    if sched.running != sorted(sched.running, key=priority):
        errors.append("running queue is out of priority order")
    if sched.seq_slots_in_use() > cfg.max_num_seqs:
        errors.append(f"{sched.seq_slots_in_use()} running seqs > max_num_seqs")
    for seq in (*sched.running, *sched.waiting, *sched.swapped):
        if seq.num_output_tokens > seq.max_output_tokens or seq.num_tokens > cfg.max_model_len:
            errors.append(f"{seq!r} exceeds its length limits")
        if seq.num_computed_tokens >= seq.num_tokens:
            errors.append(f"{seq!r} computed every known token")
    if errors:
        raise AssertionError("Scheduler integrity: " + "; ".join(errors[:5]))
