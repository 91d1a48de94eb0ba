"""What the engine hands back: ``RequestOutput`` with one ``CompletionOutput`` per choice."""

from __future__ import annotations

from dataclasses import dataclass, field


class Logprob(float):
    """One token's log probability, as vLLM's ``Logprob``: ``.logprob``, ``.rank`` (1 for the
    most likely token; the sampled or prompt token's own rank, the top-k's 1..k) and
    ``.decoded_token`` (the token's text). It is also the float itself, so arithmetic and
    comparisons work on it directly."""

    __slots__ = ("rank", "decoded_token")

    def __new__(cls, logprob: float, rank: int | None = None,
                decoded_token: str | None = None) -> Logprob:
        obj = super().__new__(cls, logprob)
        obj.rank = rank
        obj.decoded_token = decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __reduce__(self):  # copies and pickles keep rank and text
        return Logprob, (float(self), self.rank, self.decoded_token)

    def __repr__(self) -> str:
        return (f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, "
                f"decoded_token={self.decoded_token!r})")


# {token_id: Logprob}; the sampled token is always present, plus the top-k asked for
Logprobs = list[dict[int, Logprob]]


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0
    num_preemptions: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Logprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None
    # streaming: what is new since the previous output of this request
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: Logprobs | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None

    def snapshot(self) -> CompletionOutput:
        """A copy whose token and logprob lists are its own (the deltas move to the copy as
        they are). Built field by field: ``dataclasses.replace`` is several times slower,
        and this runs for every streamed row of every step."""
        return CompletionOutput(
            self.index, self.text, list(self.token_ids), self.cumulative_logprob,
            list(self.logprobs) if self.logprobs is not None else None, self.finish_reason,
            self.stop_reason, self.text_delta, self.token_ids_delta, self.logprobs_delta)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
