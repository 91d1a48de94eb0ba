"""The contract between the scheduler (policy) and the runner (GPU work): plain dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from .sequence import Sequence

priority = attrgetter("arrival_time", "seq_id")  # sort key of running/swapped: oldest first


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class ScheduledSeq:
    """One row of the batch: feed ``token_ids`` at positions ``[start_pos, start_pos + n)``.

    ``block_table`` is the sequence's live table (do not mutate it; valid until the next
    ``schedule()``); it covers every position ``< start_pos + num_scheduled_tokens``.
    ``do_sample``: this chunk ends at the last known token, so sample the next one.
    """

    seq: Sequence
    token_ids: list[int]
    start_pos: int
    num_scheduled_tokens: int
    block_table: list[int]
    do_sample: bool


@dataclass(slots=True)
class SchedulerOutput:
    """The only contract between the scheduler and the runner.

    Apply ``blocks_to_swap_out`` (gpu block, cpu slot), then ``blocks_to_swap_in`` (cpu slot,
    gpu block), then ``blocks_to_copy`` (src gpu block, dst gpu block) in list order, then run
    the forward over ``scheduled``. ``finished_seq_ids``: sequences finished since the previous
    step (the runner may drop per-sequence state such as seeded generators).
    """

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted_seq_ids: list[int] = field(default_factory=list)
    finished_seq_ids: list[int] = field(default_factory=list)
    consumed: bool = False  # set by update_from_output

    @property
    def is_empty(self) -> bool:
        """Nothing for the runner to do (no rows, no swaps, no copies)."""
        return not (
            self.scheduled
            or self.blocks_to_swap_out
            or self.blocks_to_swap_in
            or self.blocks_to_copy
        )
