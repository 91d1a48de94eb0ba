"""A request's state inside the engine (``LLMEngine.requests``): its choices, each with an
incremental detokenizer and the completion so far, its metrics; and the checks and names
around them (prompt token ids, finish reasons)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from edge_llm.outputs import CompletionOutput, Logprob, RequestMetrics
from edge_llm.sampling_params import SamplingParams

from .detokenizer import IncrementalDetokenizer
from .sequence import Sequence, SequenceStatus


@dataclass
class Choice:
    detok: IncrementalDetokenizer
    out: CompletionOutput
    done: bool = False


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    choices: dict[int, Choice] = field(default_factory=dict)
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0
    final_only: bool = False  # step() returns this request's output only when it finishes


class TokenNames:
    """Fills ``decoded_token`` of Logprob entries: each token's text, decoded once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, lps: dict[int, Logprob]) -> dict[int, Logprob]:
        for tok, lp in lps.items():
            text = self._texts.get(tok)
            if text is None:
                text = self._texts[tok] = self.tokenizer.decode([tok],
                                                                skip_special_tokens=False)
            lp.decoded_token = text
        return lps


def finish_reason(seq: Sequence) -> tuple[str, int | str | None]:
    if seq.status == SequenceStatus.FINISHED_LENGTH:
        return "length", None
    if seq.status == SequenceStatus.FINISHED_ABORTED:
        return "abort", None
    return "stop", seq.stop_reason  # a stop string, a stop_token_ids entry, or None for EOS


def checked_token_ids(ids: list, vocab: int) -> list[int]:
    """The ids as plain ints, each in [0, vocab), else ValueError. array() converts (and
    refuses non-integers) in C and min/max scan it there too: a 1,000-token prompt in ~20 us
    where a Python loop took ~300 us."""
    try:
        arr = array("q", ids)
    except (TypeError, OverflowError):
        arr = None
    if arr is None or min(arr) < 0 or max(arr) >= vocab:
        raise ValueError(f"Prompt token ids must be integers in [0, {vocab}).")
    return arr.tolist()
