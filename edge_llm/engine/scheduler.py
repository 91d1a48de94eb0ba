"""Iteration-level scheduler: request lifecycle around a per-step plan.

One engine step is::

    out = scheduler.schedule()                      # policy: pure Python, no torch
    result = runner.execute(out)                    # swap-out, swap-in, copy, forward, sample
    seqs = scheduler.update_from_output(out, result.sampled)   # {seq_id: token id}
    ... detokenize ``seqs``; on a stop string: scheduler.finish(seq, FINISHED_STOPPED)

``Scheduler`` owns the queues (waiting, running, swapped) and a request's life: admission
checks in ``add_request``, advancing sequences after the forward, forks, stops, ``finish`` /
``abort``, the gauges and the integrity checks. Who runs in a step, with how many tokens, who
is preempted, swapped in or admitted (and the prefix-cache lookup on admission) is decided by
a ``StepPlanner``, which lives for one ``schedule()`` call: the token budget and the CPU slots
released by swap-ins are its own. It moves sequences between the scheduler's queues, takes and
frees blocks of its ``BlockPool`` and slots of its ``SwapSpace``, and records rows, swaps and
copies in the step's ``SchedulerOutput``; it reads no torch.

``schedule()`` fills the token budget (``max_num_batched_tokens``) in this order:

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

Prefix caching: an admitted sequence takes the cached full blocks of its longest cached
prefix, but always computes at least its last token (that row is sampled). Requests asking for
``prompt_logprobs`` skip the lookup, since the runner needs the logits of every prompt position.

n > 1: the request starts as ONE sequence that prefills the prompt minus its last token; in
``update_from_output`` it forks into n sequences (index 0 is the original) that share its
blocks by reference count. The shared, partially filled last block is copied on write: a
child about to write into a block it shares gets a fresh block and a ``(src, dst)`` pair in
``blocks_to_copy``. Each child then feeds the last prompt token and samples its own first
token, so the runner never samples twice from one row.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.sampling_params import SamplingParams

from .block_pool import BlockPool
from .scheduler_output import ScheduledSeq, SchedulerOutput, cdiv, priority
from .sequence import Sequence, SequenceStatus
from .swap_space import SwapSpace

__all__ = ["Scheduler", "ScheduledSeq", "SchedulerOutput"]

_RUNNING = SequenceStatus.RUNNING
_WAITING = SequenceStatus.WAITING
_SWAPPED = SequenceStatus.SWAPPED


class Scheduler:
    """Continuous-batching policy over a ``BlockPool`` and a ``SwapSpace``."""

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
    ) -> None:
        cfg = scheduler_config
        if cfg.max_num_batched_tokens < cfg.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({cfg.max_num_seqs}), or some decodes would wait a step."
            )
        if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be >= "
                f"max_model_len ({cfg.max_model_len}) when chunked prefill is disabled."
            )
        self.config = cfg
        self.block_size = cache_config.block_size
        self.pool = BlockPool(num_gpu_blocks, self.block_size, cache_config.enable_prefix_caching)
        self.swap_space = SwapSpace(num_cpu_blocks)
        self.waiting: deque[Sequence] = deque()  # FIFO; recomputed victims go to the front
        self.running: list[Sequence] = []  # sorted by priority
        self.swapped: list[Sequence] = []  # sorted by priority
        self._requests: dict[str, list[Sequence]] = {}
        self.num_preemptions = 0
        self._step = 0
        self._finished_ids: list[int] = []

    # ---- admission ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> list[Sequence]:
        """Queue a request; returns the sequences created now.

        Raises ValueError (never queues) when the prompt is empty, is not shorter than
        ``max_model_len``, or prompt + max_tokens needs more KV blocks than the cache has.
        ``max_tokens`` (None: unlimited) is capped at ``max_model_len - prompt length``. With
        ``n > 1`` and a prompt longer than one token, only the first sequence exists until its
        prefill is done; the others appear in ``update_from_output``'s result with their first
        token (and in ``sequences_of``).
        """
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use.")
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty: it must hold at least one token.")
        if min(prompt) < 0:
            raise ValueError(f"prompt_token_ids must be >= 0, got {min(prompt)}.")
        cfg, bs = self.config, self.block_size
        length, max_len = len(prompt), cfg.max_model_len
        if length >= max_len:
            raise ValueError(
                f"prompt_token_ids has {length} tokens, but max_model_len is {max_len}: "
                "at least one position must remain for the output."
            )
        room = max_len - length
        max_out = room if params.max_tokens is None else min(params.max_tokens, room)
        # the last output token is sampled, never fed: its KV is never stored
        blocks = cdiv(length + max_out - 1, bs)
        if blocks > self.pool.num_blocks:
            raise ValueError(
                f"request needs {blocks} KV blocks (prompt {length} + max_tokens {max_out} "
                f"tokens, block size {bs}), but the KV cache has only {self.pool.num_blocks}."
            )
        if params.n > cfg.max_num_seqs:
            raise ValueError(f"n={params.n} exceeds max_num_seqs={cfg.max_num_seqs}.")
        if params.n == 1 or length == 1:
            seqs = [
                Sequence(request_id, i, prompt, params, max_out, arrival_time)
                for i in range(params.n)
            ]
        else:
            seqs = [Sequence(request_id, 0, prompt, params, max_out, arrival_time, params.n - 1)]
        self.waiting.extend(seqs)
        self._requests[request_id] = list(seqs)
        return seqs

    # ---- one step -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide this step's rows, swaps and copies (the module docstring gives the order)."""
        self._step += 1
        out = SchedulerOutput(finished_seq_ids=self._finished_ids)
        self._finished_ids = []
        return StepPlanner(self, self._step, out).fill()

    def seq_slots_in_use(self) -> int:
        """Running sequences plus the siblings their pending forks will add."""
        return len(self.running) + sum(s.num_pending_forks for s in self.running)

    # ---- after the forward ----------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled: dict[int, int]
    ) -> list[Sequence]:
        """Advance the scheduled sequences; ``sampled`` maps seq_id -> token for do_sample rows.

        Registers newly full blocks in the prefix cache, forks n > 1 parents whose prefill is
        done, and finishes sequences on a stop token id (after ``min_tokens``; EOS only
        without ``ignore_eos``) or on ``max_tokens`` / ``max_model_len`` ("length"), freeing
        their blocks. Stop strings are the caller's: it calls ``finish``. Rows whose sequence
        was finished or aborted during the step are skipped. Returns the sequences that got a
        token, in row order, finished ones included.
        """
        if scheduler_output.consumed:
            raise RuntimeError("update_from_output was already called for this SchedulerOutput.")
        # every row checked before any changes: a refused update leaves the scheduler as it was
        for row in scheduler_output.scheduled:
            seq = row.seq
            if seq.status is not _RUNNING:
                continue
            if seq.num_computed_tokens != row.start_pos:
                raise RuntimeError(f"{seq!r} changed between schedule() and update_from_output().")
            if row.do_sample and sampled.get(seq.seq_id) is None:
                raise KeyError(
                    f"sampled has no token for seq_id {seq.seq_id} (request "
                    f"{seq.request_id!r}), which was scheduled with do_sample=True."
                )
        scheduler_output.consumed = True
        pool, bs = self.pool, self.block_size
        caching = pool.enable_prefix_caching
        got: list[Sequence] = []
        finished = False
        for row in scheduler_output.scheduled:
            seq = row.seq
            if seq.status is not _RUNNING:
                continue
            computed = seq.num_computed_tokens = row.start_pos + row.num_scheduled_tokens
            if caching and computed >= (seq.num_registered_blocks + 1) * bs:
                pool.cache_full_blocks(seq)
            if row.do_sample:
                token = sampled[seq.seq_id]
                seq.append_token(token)
                got.append(seq)
                if self._check_stop(seq, token):
                    self._release(seq)
                    finished = True
            elif seq.num_pending_forks and computed == seq.prefill_target:
                self._fork(seq)
        if finished:
            self.running = [s for s in self.running if s.status is _RUNNING]
        return got

    def _check_stop(self, seq: Sequence, token: int) -> bool:
        num_out = len(seq.output_token_ids)
        if token in seq.stop_token_ids and num_out >= seq.params.min_tokens:
            seq.status = SequenceStatus.FINISHED_STOPPED
            # vLLM reports a matched stop_token_ids entry; EOS gives None
            seq.stop_reason = token if token in seq.params.stop_token_ids else None
            return True
        if num_out >= seq.max_output_tokens:
            seq.status = SequenceStatus.FINISHED_LENGTH
            return True
        return False

    def _fork(self, parent: Sequence) -> None:
        siblings = self._requests[parent.request_id]
        for index in range(1, parent.num_pending_forks + 1):
            child = parent.fork(index)
            self.pool.touch(child.block_table)
            bisect.insort(self.running, child, key=priority)
            siblings.append(child)
        parent.num_pending_forks = 0

    # ---- finishing ------------------------------------------------------------------------
    def finish(
        self, seq: Sequence, status: SequenceStatus, stop_reason: int | str | None = None
    ) -> None:
        """End ``seq`` now with a FINISHED_* status and free its blocks and swap slots.

        No-op if it already finished. Safe between ``schedule()`` and ``update_from_output()``
        (its row is then skipped); freed blocks are reused from the next ``schedule()`` on.
        """
        if seq.status.is_finished:
            return
        if not status.is_finished:
            raise ValueError(f"finish() needs a FINISHED_* status, got {status.name}.")
        if seq.status is _RUNNING:
            self.running.remove(seq)
        elif seq.status is _WAITING:
            self.waiting.remove(seq)
        else:
            self.swapped.remove(seq)
        seq.status = status
        if stop_reason is not None:
            seq.stop_reason = stop_reason
        self._release(seq)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every unfinished sequence of the request as aborted; unknown ids: []."""
        seqs = [s for s in self._requests.get(request_id, ()) if not s.status.is_finished]
        for seq in seqs:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seqs

    def _release(self, seq: Sequence) -> None:
        """Free a finished sequence's blocks and slots (the caller removed it from queues)."""
        self.pool.free(reversed(seq.block_table))
        seq.block_table = []  # a new list: rows of an in-flight step keep their table
        if seq.swap_slots:
            self.swap_space.free(seq.swap_slots)
            seq.swap_slots = []
        self._finished_ids.append(seq.seq_id)
        group = self._requests.get(seq.request_id)
        if group is not None and all(s.status.is_finished for s in group):
            del self._requests[seq.request_id]

    # ---- queries --------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._requests)

    def sequences_of(self, request_id: str) -> list[Sequence]:
        """The request's sequences so far (n > 1 children appear after the fork)."""
        return list(self._requests.get(request_id, ()))

    def stats(self) -> dict[str, int | float]:
        """Gauges and counters for metrics.

        ``num_running`` / ``num_waiting`` / ``num_swapped`` count sequences;
        ``num_preemptions``, ``prefix_queries`` and ``prefix_hits`` (prompt tokens looked up /
        served by the prefix cache at first admission) are totals since start;
        ``kv_cache_usage`` and ``cpu_swap_usage`` are fractions in [0, 1].
        """
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_swapped": len(self.swapped),
            "num_unfinished_requests": len(self._requests),
            "num_preemptions": self.num_preemptions,
            "prefix_queries": self.pool.prefix_queries,
            "prefix_hits": self.pool.prefix_hits,
            "kv_cache_usage": self.pool.usage,
            "cpu_swap_usage": self.swap_space.usage,
            "num_free_blocks": self.pool.num_free_blocks,
        }

    def check_integrity(self) -> None:
        """Pool and swap checks, plus: every ref count equals the number of tables holding the
        block, queues match statuses, tables cover the computed positions, limits hold.
        O(blocks + tokens): for tests and idle debug checks. Raises AssertionError naming the
        first problems."""
        self.pool.check_integrity()
        self.swap_space.check_integrity()
        bs, cfg, errors = self.block_size, self.config, []
        refs: Counter[int] = Counter()
        for seq in self.running:
            refs.update(seq.block_table)
            lo, hi = cdiv(seq.num_computed_tokens, bs), cdiv(seq.num_tokens, bs)
            if seq.status is not _RUNNING or not lo <= len(seq.block_table) <= hi:
                errors.append(f"bad running {seq!r}")
        for seq in self.waiting:
            if seq.status is not _WAITING or seq.block_table or seq.num_computed_tokens:
                errors.append(f"bad waiting {seq!r}")
        for seq in self.swapped:
            if (
                seq.status is not _SWAPPED
                or seq.block_table
                or (len(seq.swap_slots) != cdiv(seq.num_computed_tokens, bs))
            ):
                errors.append(f"bad swapped {seq!r}")
        num_slots = sum(len(s.swap_slots) for s in self.swapped)
        if num_slots != self.swap_space.num_used:
            errors.append(f"swapped seqs hold {num_slots} slots, {self.swap_space.num_used} used")
        wrong = [b for b in range(self.pool.num_blocks) if self.pool.ref_count(b) != refs[b]]
        if wrong:
            b = wrong[0]
            errors.append(f"block {b}: ref count {self.pool.ref_count(b)}, tables {refs[b]}")
        if self.running != sorted(self.running, key=priority):
            errors.append("running queue is out of priority order")
        if self.seq_slots_in_use() > cfg.max_num_seqs:
            errors.append(f"{self.seq_slots_in_use()} running seqs > max_num_seqs")
        for seq in (*self.running, *self.waiting, *self.swapped):
            if seq.num_output_tokens > seq.max_output_tokens or seq.num_tokens > cfg.max_model_len:
                errors.append(f"{seq!r} exceeds its length limits")
            if seq.num_computed_tokens >= seq.num_tokens:
                errors.append(f"{seq!r} computed every known token")
        if errors:
            raise AssertionError("Scheduler integrity: " + "; ".join(errors[:5]))


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
        """Decide this step's rows, swaps and copies (the module docstring gives the order)."""
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
