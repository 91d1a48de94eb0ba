"""Iteration-level scheduler: request lifecycle around a per-step plan.

One engine step is::

    out = scheduler.schedule()                      # policy: pure Python, no torch
    result = runner.execute(out)                    # swap-out, swap-in, copy, forward, sample
    seqs = scheduler.update_from_output(out, result.sampled)   # {seq_id: token id}
    ... detokenize ``seqs``; on a stop string: scheduler.finish(seq, FINISHED_STOPPED)

This module owns the queues (waiting, running, swapped) and a request's life: admission checks
in ``add_request``, advancing sequences after the forward, forks, stops, ``finish`` / ``abort``
and the gauges. Who runs in a step, with how many tokens, who is preempted, swapped in or
admitted (and the prefix-cache lookup on admission) is ``scheduler_plan.StepPlanner``'s, whose
docstring gives the order in which the token budget is filled.

n > 1: the request starts as ONE sequence that prefills the prompt minus its last token; in
``update_from_output`` it forks into n sequences (index 0 is the original) that share its
blocks by reference count. The shared, partially filled last block is copied on write: a
child about to write into a block it shares gets a fresh block and a ``(src, dst)`` pair in
``blocks_to_copy``. Each child then feeds the last prompt token and samples its own first
token, so the runner never samples twice from one row.
"""

from __future__ import annotations

import bisect
from collections import deque

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.sampling_params import SamplingParams

from .block_pool import BlockPool
from .scheduler_checks import check_scheduler_integrity
from .scheduler_output import ScheduledSeq, SchedulerOutput, cdiv, priority
from .scheduler_plan import StepPlanner
from .sequence import Sequence, SequenceStatus
from .swap_space import SwapSpace

__all__ = ["Scheduler", "ScheduledSeq", "SchedulerOutput"]

_RUNNING = SequenceStatus.RUNNING
_WAITING = SequenceStatus.WAITING


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
        """Decide this step's rows, swaps and copies (``scheduler_plan`` gives the order)."""
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
        scheduler_output.consumed = True
        pool, bs = self.pool, self.block_size
        caching = pool.enable_prefix_caching
        got: list[Sequence] = []
        finished = False
        for row in scheduler_output.scheduled:
            seq = row.seq
            if seq.status is not _RUNNING:
                continue
            if seq.num_computed_tokens != row.start_pos:
                raise RuntimeError(f"{seq!r} changed between schedule() and update_from_output().")
            computed = seq.num_computed_tokens = row.start_pos + row.num_scheduled_tokens
            if caching and computed >= (seq.num_registered_blocks + 1) * bs:
                pool.cache_full_blocks(seq)
            if row.do_sample:
                token = sampled.get(seq.seq_id)
                if token is None:
                    raise KeyError(
                        f"sampled has no token for seq_id {seq.seq_id} (request "
                        f"{seq.request_id!r}), which was scheduled with do_sample=True."
                    )
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
        O(blocks + tokens): for tests and idle debug checks. Raises AssertionError."""
        check_scheduler_integrity(self)
