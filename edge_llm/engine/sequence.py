"""One generated choice of a request: its tokens, KV bookkeeping and lifecycle status.

A ``Sequence`` is owned by the ``Scheduler``: only the scheduler changes its status, counters
and block table. The runner and the detokenizer read it (``params``, ``prompt_token_ids``,
``output_token_ids``, ``all_token_ids``); the engine may set ``stop_reason`` after it called
``Scheduler.finish``.

Token positions and what is known about them::

    all_token_ids   [ p0 p1 ... p(P-1) | o0 o1 ... o(O-1) ]      num_tokens = P + O
    KV in the cache [ <--- num_computed_tokens ---> ]             (a prefix of the above)
    block_table     [ b0 | b1 | ... ]  block i holds positions [i*block_size, (i+1)*block_size)

Outside a step, ``num_computed_tokens <= num_tokens - 1``: the newest token's KV is computed
in the step that feeds it. After a preemption by recompute, ``num_computed_tokens`` is 0 and
the whole history (prompt + outputs so far) is prefilled again; ``prompt_token_ids`` and
``output_token_ids`` keep their meaning, so counts and limits are unaffected.
"""

from __future__ import annotations

import enum
import itertools
import time
from typing import Any

from edge_llm.sampling_params import SamplingParams

_next_seq_id = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI ``finish_reason`` ("stop", "length", "abort"), None while unfinished."""
        return _FINISH_REASONS.get(self)


_FINISHED = frozenset(
    (
        SequenceStatus.FINISHED_STOPPED,
        SequenceStatus.FINISHED_LENGTH,
        SequenceStatus.FINISHED_ABORTED,
    )
)
_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
}


class Sequence:
    """Token history and KV state of one choice (``index``) of a request.

    ``max_output_tokens`` is ``params.max_tokens`` capped so that prompt + output fit in
    ``max_model_len`` (the scheduler computes it). ``stop_token_ids`` is the set of token ids
    that end the sequence: ``params.stop_token_ids`` plus, unless ``ignore_eos``, the ids the
    engine put in ``params.all_stop_token_ids`` (EOS, generation-config stops) before
    ``Scheduler.add_request``.
    """

    __slots__ = (
        "seq_id",
        "request_id",
        "index",
        "prompt_token_ids",
        "output_token_ids",
        "params",
        "status",
        "arrival_time",
        "max_output_tokens",
        "stop_token_ids",
        "stop_reason",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_table",
        "block_hashes",
        "num_registered_blocks",
        "swap_slots",
        "num_preemptions",
        "num_pending_forks",
        "last_scheduled_step",
        "matcher",
        "_token_ids",
    )

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_output_tokens: int,
        arrival_time: float | None = None,
        num_pending_forks: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt_token_ids must hold at least one token.")
        if max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens}.")
        self.seq_id: int = next(_next_seq_id)
        self.request_id = request_id
        self.index = index
        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.status = SequenceStatus.WAITING
        self.arrival_time: float = time.time() if arrival_time is None else arrival_time
        self.max_output_tokens = max_output_tokens
        stops = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stops |= params.all_stop_token_ids
        self.stop_token_ids: frozenset[int] = frozenset(stops)
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0  # positions whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at admission
        self.block_table: list[int] = []  # GPU block ids; empty while waiting or swapped
        # hashes of the leading full blocks of all_token_ids (a pure function of the tokens,
        # filled lazily by BlockPool), and how many of block_table's blocks were offered to
        # the prefix-cache index
        self.block_hashes: list[bytes] = []
        self.num_registered_blocks = 0
        self.swap_slots: list[int] = []  # CPU slots holding block_table's data while SWAPPED
        self.num_preemptions = 0
        # n > 1: the first sequence prefills the prompt minus its last token, then the
        # scheduler forks this many siblings that share its blocks
        self.num_pending_forks = num_pending_forks
        self.last_scheduled_step = -1
        # the grammar matcher of a constrained output (structured_output.py), advanced by
        # append_token, so its state always matches output_token_ids
        self.matcher: Any = None
        self._token_ids: list[int] = list(self.prompt_token_ids)

    # ---- token views (no copies: treat the returned lists as read-only) -------------------
    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + outputs, the live internal list (O(1)); do not mutate it."""
        return self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self._token_ids[-1]

    @property
    def prefill_target(self) -> int:
        """How many positions must hold KV before this sequence can sample or fork."""
        return len(self._token_ids) - (1 if self.num_pending_forks else 0)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def append_token(self, token_id: int) -> None:
        """Record a sampled token (its KV is computed in the next step that feeds it) and
        advance the matcher, if any, past it."""
        if self.matcher is not None:
            self.matcher.consume_token(token_id)
        self.output_token_ids.append(token_id)
        self._token_ids.append(token_id)

    def fork(self, index: int) -> Sequence:
        """A sibling with choice ``index`` sharing this sequence's tokens and block table.

        The caller (the scheduler) owns the block references: it must ``touch`` the child's
        blocks in the pool.
        """
        child = Sequence(
            self.request_id,
            index,
            self.prompt_token_ids,
            self.params,
            self.max_output_tokens,
            self.arrival_time,
        )
        child.output_token_ids = list(self.output_token_ids)
        child._token_ids = list(self._token_ids)
        child.stop_token_ids = self.stop_token_ids
        child.status = self.status
        child.num_computed_tokens = self.num_computed_tokens
        child.num_cached_tokens = self.num_cached_tokens
        child.block_table = list(self.block_table)
        child.block_hashes = list(self.block_hashes)
        child.num_registered_blocks = self.num_registered_blocks
        if self.matcher is not None:  # each choice its own grammar state
            child.matcher = self.matcher.deep_copy()
        return child

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, request_id={self.request_id!r}, "
            f"index={self.index}, status={self.status.name}, tokens={self.num_prompt_tokens}"
            f"+{self.num_output_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table})"
        )
