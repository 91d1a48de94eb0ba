"""One step's plan: which sequences run, with how many tokens, and who is preempted.

``StepPlanner(scheduler, step, out).fill()`` is the body of ``Scheduler.schedule()``. It moves
sequences between the scheduler's queues, takes and frees blocks of its ``BlockPool`` and slots
of its ``SwapSpace``, and records rows, swaps and copies in ``out``; it reads no torch. The
planner lives for one step: the token budget and the CPU slots released by swap-ins are its own.

``fill()`` fills the token budget (``max_num_batched_tokens``) in this order:

    1. running decodes, oldest first (1 token each): decodes never stall behind a prefill;
       if any run and prefills are chunked, the step's budget shrinks to
       ``max_tokens_with_decodes`` (when set), theirs included
    2. swapped sequences come back (swap-in), oldest first; skipped in a step that preempted
    3. running prefill chunks (chunked prefill: a long prompt spreads over several steps)
    4. waiting requests, FIFO; only when nothing is swapped and nothing was preempted, and
       only while the free blocks also cover every running sequence's growth reserve
       (``SchedulerConfig.growth_reserve`` more tokens each, capped at its remaining
       ``max_output_tokens``), the admitted ones included

A sequence that needs a new block when none is free preempts the most recently arrived
running sequence not yet scheduled in this step; a decode with no such victim preempts
itself, a prefill chunk first shrinks to the free blocks. A victim is swapped out when
``SchedulerConfig.preemption_mode`` asks for it ("swap"; by default only a sequence whose
request has siblings, n > 1) and the swap space has room for its blocks; else it is
recomputed: its blocks are freed (full blocks stay in the prefix cache) and it goes back to
the front of the waiting queue with ``num_computed_tokens = 0``, so prompt + outputs so far
are prefilled again.

Why the runner's order swap-out -> swap-in -> copy -> forward is safe within one step: GPU
blocks freed by a preemption are reallocated only as copy destinations or fresh blocks
(written after the swap-out read them) or as swap-in targets, and swap-in is skipped in a
step with preemptions, so no copy source is overwritten before it is read. CPU slots freed by
a swap-in are released only at the end of ``fill()``, so no swap-out of the same step can
reuse them.

Copy on write: a sequence about to write into a partially filled last block that it shares
(n > 1 siblings after the fork) gets a fresh block and a ``(src, dst)`` pair in
``blocks_to_copy``.

Prefix caching: an admitted sequence takes the cached full blocks of its longest cached
prefix, but always computes at least its last token (that row is sampled). Requests asking for
``prompt_logprobs`` skip the lookup, since the runner needs the logits of every prompt position.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from .scheduler_output import ScheduledSeq, SchedulerOutput, cdiv, priority
from .sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from .scheduler import Scheduler

_RUNNING = SequenceStatus.RUNNING
_WAITING = SequenceStatus.WAITING
_SWAPPED = SequenceStatus.SWAPPED


class StepPlanner:
    """Fills one step's ``SchedulerOutput`` over a scheduler's queues, pool and swap space.

    ``step`` is the scheduler's step number (rows scheduled now get ``last_scheduled_step =
    step``); ``out`` arrives with its ``finished_seq_ids`` set. Use once: call ``fill()``.
    """

    def __init__(self, sched: Scheduler, step: int, out: SchedulerOutput) -> None:
        self.sched = sched
        self.step = step
        self.out = out
        self.budget = sched.config.max_num_batched_tokens  # tokens left to schedule this step
        self.capped = 0  # budget taken away by max_tokens_with_decodes (_cap_with_decodes)
        self.slots_to_free: list[int] = []  # CPU slots of this step's swap-ins

    def fill(self) -> SchedulerOutput:
        """Decide this step's rows, swaps and copies (see the module docstring for the order)."""
        sched, out = self.sched, self.out
        self._schedule_running(decodes=True)
        self._cap_with_decodes()
        if not out.preempted_seq_ids:
            self._schedule_swapped()
        self._schedule_running(decodes=False)
        if not out.preempted_seq_ids and not sched.swapped:
            self._schedule_waiting()
        if self.slots_to_free:
            sched.swap_space.free(self.slots_to_free)
            self.slots_to_free = []
        out.num_batched_tokens = (sched.config.max_num_batched_tokens - self.capped
                                  - self.budget)
        return out

    def _cap_with_decodes(self) -> None:
        """With decodes scheduled and chunked prefill on, the rest of the step gets at most
        ``max_tokens_with_decodes`` minus their tokens (None or 0: no cap; the engine has
        resolved "auto"). Decodes that alone reach the cap leave the budget as it is: the
        step cannot fit it, and prompts keep being admitted."""
        config = self.sched.config
        cap = config.max_tokens_with_decodes
        if not isinstance(cap, int) or cap <= 0 or not config.enable_chunked_prefill:
            return
        used = config.max_num_batched_tokens - self.budget
        if 0 < used < cap and cap - used < self.budget:  # decodes alone past it: left off
            self.capped = self.budget - (cap - used)
            self.budget = cap - used

    def _schedule_running(self, decodes: bool) -> None:
        step, chunked = self.step, self.sched.config.enable_chunked_prefill
        for seq in list(self.sched.running):
            if self.budget == 0:
                return
            if seq.status is not _RUNNING or seq.last_scheduled_step == step:
                continue
            if (seq.num_tokens - seq.num_computed_tokens == 1) is not decodes:
                continue
            left = seq.prefill_target - seq.num_computed_tokens
            k = min(left, self.budget)
            if k < left and not chunked:
                continue
            k = self._reserve(seq, k, decode=decodes)
            if k:
                self._emit(seq, k)

    def _reserve(self, seq: Sequence, k: int, decode: bool) -> int:
        """Make the block table cover ``k`` more positions; returns the tokens granted.

        Preempts victims while nothing fits; a prefill chunk (chunked mode) shrinks to what
        fits, a decode without a victim preempts itself (returns 0).
        """
        sched, out = self.sched, self.out
        bs, pool = sched.block_size, sched.pool
        shrink = not decode and sched.config.enable_chunked_prefill
        table = seq.block_table
        while True:
            start = seq.num_computed_tokens
            slack = len(table) * bs - start  # unwritten positions in the last block
            cow = slack > 0 and pool.ref_count(table[-1]) > 1
            free = pool.num_free_blocks - cow
            fit = slack + free * bs if free >= 0 else 0
            if fit >= k or (shrink and fit > 0):
                break
            victim = self._pick_victim(seq)
            if victim is None:
                if decode:
                    self._preempt(seq)
                return 0
            self._preempt(victim)
        k = min(k, fit)
        if cow:  # the shared, partially filled last block: copy on write
            (new,) = pool.allocate(1)
            out.blocks_to_copy.append((table[-1], new))
            pool.free((table[-1],))
            table[-1] = new
        need = cdiv(start + k, bs) - len(table)
        if need > 0:
            table.extend(pool.allocate(need))
        return k

    def _pick_victim(self, current: Sequence) -> Sequence | None:
        step = self.step
        for seq in reversed(self.sched.running):
            if seq is not current and seq.last_scheduled_step != step:
                return seq
        return None

    def _preempt(self, seq: Sequence) -> None:
        sched, out = self.sched, self.out
        sched.running.remove(seq)
        sched.num_preemptions += 1
        seq.num_preemptions += 1
        out.preempted_seq_ids.append(seq.seq_id)
        table = seq.block_table
        if table and self._swaps(seq) and sched.swap_space.can_swap_out(len(table)):
            seq.swap_slots = sched.swap_space.allocate(len(table))
            out.blocks_to_swap_out.extend(zip(table, seq.swap_slots, strict=True))
            seq.status = _SWAPPED
            bisect.insort(sched.swapped, seq, key=priority)
        else:
            seq.num_computed_tokens = 0
            seq.num_registered_blocks = 0
            seq.status = _WAITING
            sched.waiting.appendleft(seq)
        sched.pool.free(reversed(table))
        seq.block_table = []

    def _swaps(self, seq: Sequence) -> bool:
        """Whether a preempted ``seq`` goes to the swap space (see the module docstring)."""
        mode = self.sched.config.preemption_mode
        if mode is not None:
            return mode == "swap"
        return seq.num_pending_forks > 0 or len(self.sched.sequences_of(seq.request_id)) > 1

    def _schedule_swapped(self) -> None:
        sched, out = self.sched, self.out
        if not sched.swapped:
            return
        bs, pool, chunked = sched.block_size, sched.pool, sched.config.enable_chunked_prefill
        used = sched.seq_slots_in_use()
        while sched.swapped and self.budget > 0:
            seq = sched.swapped[0]
            if used + 1 + seq.num_pending_forks > sched.config.max_num_seqs:
                return
            left = seq.prefill_target - seq.num_computed_tokens
            k = min(left, self.budget)
            num_in = len(seq.swap_slots)
            free = pool.num_free_blocks - num_in
            fit = num_in * bs - seq.num_computed_tokens + free * bs
            if free < 0 or fit <= 0 or (fit < k and not chunked):
                return
            k = min(k, fit)
            del sched.swapped[0]
            blocks = pool.allocate(num_in)
            out.blocks_to_swap_in.extend(zip(seq.swap_slots, blocks, strict=True))
            self.slots_to_free.extend(seq.swap_slots)
            seq.swap_slots = []
            need = cdiv(seq.num_computed_tokens + k, bs) - num_in
            seq.block_table = blocks + pool.allocate(need) if need > 0 else blocks
            seq.num_registered_blocks = 0  # new block ids: offer them to the index again
            self._start_running(seq)
            used += 1 + seq.num_pending_forks
            self._emit(seq, k)

    def _schedule_waiting(self) -> None:
        sched = self.sched
        if not sched.waiting:
            return
        bs, pool, chunked = sched.block_size, sched.pool, sched.config.enable_chunked_prefill
        used = sched.seq_slots_in_use()
        horizon = sched.config.growth_reserve
        reserve: int | None = None  # the running sequences' growth, summed when first needed
        while sched.waiting and self.budget > 0:
            seq = sched.waiting[0]
            if used + 1 + seq.num_pending_forks > sched.config.max_num_seqs:
                return
            target = seq.prefill_target
            hits = self._lookup_prefix(seq, target)
            cached = len(hits) * bs
            k = min(target - cached, self.budget)
            if k < target - cached and not chunked:
                return
            need = cdiv(cached + k, bs) - len(hits)
            free = pool.num_free_blocks - pool.num_evictable(hits)
            if need > free:
                return
            # with nothing running, the reserve is waived so that the queue always moves
            if horizon and sched.running:
                if reserve is None:  # includes the sequences admitted so far in this loop
                    reserve = sum(self._growth_blocks(s, horizon) for s in sched.running)
                own = self._growth_blocks(seq, horizon, cdiv(cached + k, bs))
                if need + reserve + own > free:
                    return
                reserve += own
            sched.waiting.popleft()
            pool.touch(hits)
            if seq.num_preemptions == 0:  # first admission: what the client sees as cached
                seq.num_cached_tokens = cached
                pool.record_prefix_lookup(seq.num_prompt_tokens, cached)
            seq.block_table = hits + pool.allocate(need)
            seq.num_computed_tokens = cached
            seq.num_registered_blocks = len(hits)
            self._start_running(seq)
            used += 1 + seq.num_pending_forks
            self._emit(seq, k)

    def _growth_blocks(self, seq: Sequence, horizon: int, held: int | None = None) -> int:
        """Blocks beyond the ``held`` ones (default: its table) that ``seq`` needs for all its
        tokens plus ``horizon`` more outputs, capped at its ``max_output_tokens``."""
        left = seq.max_output_tokens - len(seq.output_token_ids)
        end = seq.num_tokens + min(horizon, max(left, 0))
        held = len(seq.block_table) if held is None else held
        return max(0, cdiv(end, self.sched.block_size) - held) * (1 + seq.num_pending_forks)

    def _lookup_prefix(self, seq: Sequence, target: int) -> list[int]:
        """Cached full blocks of the prefix, leaving at least one position to compute."""
        if seq.params.prompt_logprobs is not None:
            return []  # the runner needs the logits of every prompt position
        max_blocks = (target - 1) // self.sched.block_size
        if max_blocks <= 0:
            return []
        return self.sched.pool.get_computed_blocks(seq.all_token_ids, seq.block_hashes,
                                                   max_blocks)

    def _start_running(self, seq: Sequence) -> None:
        seq.status = _RUNNING
        bisect.insort(self.sched.running, seq, key=priority)

    def _emit(self, seq: Sequence, k: int) -> None:
        start = seq.num_computed_tokens
        tokens = seq.all_token_ids
        self.out.scheduled.append(
            ScheduledSeq(
                seq,
                tokens[start : start + k],
                start,
                k,
                seq.block_table,
                start + k == len(tokens),
            )
        )
        self.budget -= k
        seq.last_scheduled_step = self.step
