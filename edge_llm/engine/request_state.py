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


def checked_request(ids: list, params: SamplingParams, vocab: int, max_model_len: int
                    ) -> list[int]:
    """The prompt ids to run (the last ``truncate_prompt_tokens`` of them when set), checked
    with the token ids of ``params`` against the vocabulary and the context; ValueError says
    what is wrong. (A bad id in the sampler would fail the whole step, not one request.)"""
    if (k := params.truncate_prompt_tokens) is not None:  # the last k tokens, as vLLM keeps
        ids = ids[-(max_model_len if k == -1 else k):]
    if not ids:
        raise ValueError("The prompt is empty: it must contain at least one token.")
    ids = checked_token_ids(ids, vocab)
    if len(ids) >= max_model_len:
        raise ValueError(f"This model's maximum context length is {max_model_len} tokens, but "
                         f"the prompt has {len(ids)} tokens.")
    for name, toks in (("logit_bias", params.logit_bias or {}),
                       ("stop_token_ids", params.stop_token_ids),
                       ("allowed_token_ids", params.allowed_token_ids or [])):
        if outside := sorted(t for t in toks if t >= vocab):
            raise ValueError(f"{name} holds token id(s) {outside[:5]}, outside [0, {vocab}).")
    return ids
