"""Decode run-ahead: the next decode step planned before the step in flight has returned.

With run-ahead (llm_engine.py), while decode step n runs on the GPU the engine launches step
n + 1 at once, feeding each row the token step n samples on the device, so the GPU does not
wait for the host to read step n's tokens, update the scheduler and schedule again (vLLM's
async scheduling does the same). That is only possible when the next step can be known
without step n's tokens: ``plan_ahead`` returns it, assuming every row goes on, or None.

Then, after step n's tokens are in (``update_from_output``), ``schedule()`` runs as always
and ``ahead_matches`` decides whether the launched step is the scheduled one: the same rows
at the same positions, minus the sequences that stopped at step n (their rows' results are
ignored; the KV they wrote went to a partially filled block that is now free). Any other
difference (a new request admitted, a preemption, a swap, a copy) and the engine launches the
scheduled step after it; the run-ahead step then only cost GPU time, since every slot it
wrote is rewritten with the same values or belongs to a freed block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .scheduler_output import ScheduledSeq, SchedulerOutput
from .sequence import SequenceStatus

if TYPE_CHECKING:
    from .scheduler import Scheduler

_RUNNING = SequenceStatus.RUNNING


def plan_ahead(sched: Scheduler,
               prev: SchedulerOutput) -> tuple[list[ScheduledSeq], list[int]] | None:
    """The rows of the decode step after ``prev`` (in flight: not yet updated) if every
    sequence gets its token and goes on, and for each the index of its row in ``prev``
    (whose sampled token it feeds; ``token_ids`` are placeholders). Sequences that ``prev``'s
    token ends by length are left out. None when that step cannot be known now: requests
    waiting or swapped out, a running sequence ``prev`` did not schedule, a row that is not a
    one-token decode, or n > 1 requests (their shared blocks are copied on write). A row
    whose next position opens a new block gets that block now (what ``schedule()`` would
    allocate); when the pool cannot spare them, None."""
    rows = prev.scheduled
    if (sched.waiting or sched.swapped or not rows or len(rows) != len(sched.running)
            or prev.blocks_to_swap_out or prev.blocks_to_swap_in or prev.blocks_to_copy):
        return None
    bs, pool = sched.block_size, sched.pool
    ahead: list[ScheduledSeq] = []
    index: list[int] = []
    opening = []
    for i, r in enumerate(rows):
        seq = r.seq
        if (seq.status is not _RUNNING or r.num_scheduled_tokens != 1 or not r.do_sample
                or seq.params.n != 1 or seq.num_computed_tokens != r.start_pos
                or seq.num_tokens != r.start_pos + 1):
            return None
        if seq.num_output_tokens + 1 >= seq.max_output_tokens:
            continue  # prev's token is its last
        pos = r.start_pos + 1
        table = seq.block_table
        if pos // bs == len(table):
            opening.append(table)
        elif pos // bs > len(table) or pool.ref_count(table[pos // bs]) != 1:
            return None
        ahead.append(ScheduledSeq(seq, [0], pos, 1, table, True))
        index.append(i)
    if not ahead or (opening and pool.num_free_blocks < len(opening) + 1):
        return None  # (one free block kept for whatever the next schedule() needs)
    if opening:
        for table, block in zip(opening, pool.allocate(len(opening)), strict=True):
            table.append(block)
    return ahead, index


def ahead_matches(ahead: list[ScheduledSeq], nxt: SchedulerOutput) -> bool:
    """True when the scheduled step ``nxt`` is the run-ahead step ``ahead`` less some of its
    rows: every scheduled row is one of ``ahead``'s sequences at the same position, and
    ``nxt`` swaps, copies and preempts nothing."""
    if (not nxt.scheduled or nxt.blocks_to_swap_out or nxt.blocks_to_swap_in
            or nxt.blocks_to_copy or nxt.preempted_seq_ids):
        return False
    pos = {r.seq.seq_id: r.start_pos for r in ahead}
    return all(
        s.num_scheduled_tokens == 1 and s.do_sample and pos.get(s.seq.seq_id) == s.start_pos
        for s in nxt.scheduled
    )
