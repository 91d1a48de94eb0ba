"""What a launched step returns: ``RunnerOutput`` (sampled tokens, logprobs, prompt logprobs by
sequence) and ``PendingStep``, the handle of a step whose kernels are queued (engine/runner.py
launches, ``collect()`` waits for the tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sample_row import SampleRow
from .sampler import Sampler
from .scheduler_output import ScheduledSeq


@dataclass
class RunnerOutput:
    sampled: dict[int, int] = field(default_factory=dict)  # seq_id -> token id
    logprobs: dict[int, dict[int, float] | None] = field(default_factory=dict)
    sampled_logprobs: dict[int, float] = field(default_factory=dict)
    # seq_id -> (position of the first entry, logprobs of prompt tokens from there on)
    prompt_logprobs: dict[int, tuple[int, list[dict[int, float]]]] = field(default_factory=dict)


class PendingStep:
    """A launched step: its kernels are queued; ``collect()`` waits for the sampled tokens
    (the one device-to-host copy of the step) and returns the RunnerOutput."""

    def __init__(self, out: RunnerOutput) -> None:
        self.out = out
        # (rows, their sample rows, the packed device tensor: Sampler.sample_on_device)
        self.sampling: tuple[list[ScheduledSeq], list[SampleRow], torch.Tensor] | None = None
        # the sampled ids on the device, one per row of ``sampling`` (None: packed with
        # logprobs); a run-ahead step feeds them as its input ids
        self.tokens: torch.Tensor | None = None
        self._host = None  # (pinned copy of packed, CUDA event after its copy)
        self.generators = None  # a run-ahead step: the sampler's snapshot from before it

    def set_sampling(self, rows: list[ScheduledSeq], sample_rows: list[SampleRow],
                     packed: torch.Tensor) -> None:
        """The step's sampling, queued: ``packed`` (``Sampler.sample_on_device``) for
        ``rows``. On a GPU its copy to pinned host memory is queued now, ahead of any step
        launched after this one (a run-ahead step would otherwise delay ``collect``)."""
        self.sampling = (rows, sample_rows, packed)
        if packed.dtype == torch.int64 and packed.numel() == len(rows):
            self.tokens = packed
        if packed.is_cuda:
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(packed.device))
            self._host = (host, done)

    def wait(self) -> None:
        """Block until the step's sampled tokens are on the host (no-op without a GPU copy;
        ``collect`` waits anyway). Steps launched after this one are not waited for."""
        if self._host is not None:
            self._host[1].synchronize()

    def collect(self) -> RunnerOutput:
        if self.sampling is not None:
            rows, sample_rows, packed = self.sampling
            self.sampling = None
            if self._host is not None:  # copied when launched: a later launch cannot delay it
                self.wait()
                packed = self._host[0]
            res = Sampler.unpack(packed.tolist(), sample_rows)
            out = self.out
            for i, s in enumerate(rows):
                sid = s.seq.seq_id
                out.sampled[sid] = res.token_ids[i]
                out.logprobs[sid] = res.logprobs[i]
                out.sampled_logprobs[sid] = res.sampled_logprobs[i]
        return self.out
