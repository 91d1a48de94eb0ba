"""Sampling parameters with vLLM's names and defaults.

Invalid values raise ``ValueError`` naming the field, so the server can turn them into a 400
that points at the offending request field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import IntEnum


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on the output (vLLM's ``StructuredOutputsParams``): exactly one of a JSON
    schema (a dict or its JSON text), ``json_object`` (any JSON object), a regular expression,
    a choice among strings, or a grammar (Lark, as llguidance reads it, or llama.cpp's GBNF).
    ``whitespace_flexible`` lets JSON carry free whitespace (off: compact JSON, which keeps
    small models from padding a reply with blank lines)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    whitespace_flexible: bool = False

    def __post_init__(self) -> None:
        kinds = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, "
                             f"grammar, json_object; got {kinds or 'none'}.")
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs choice must be a non-empty list of strings, "
                             f"got {self.choice!r}.")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs {name} must be a non-empty string.")

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar")
                    if getattr(self, n) is not None)


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1


_EPS = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables top-k, as in vLLM
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None  # number of top logprobs per sampled token (0: only the sampled)
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    # only these token ids may be sampled (vLLM's allowed_token_ids)
    allowed_token_ids: list[int] | None = None
    # keep only the last k prompt tokens (-1: the model's context length), as vLLM does
    truncate_prompt_tokens: int | None = None
    # constrain the output to a JSON schema, regex, choice or grammar (vLLM's field)
    structured_outputs: StructuredOutputsParams | None = None
    # filled in by the engine: eos and model-generation-config stop ids
    all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    # filled in by the engine: the model's EOS ids, kept from being sampled while fewer than
    # min_tokens are out, with ignore_eos too (as vLLM does)
    eos_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if self.top_k == 0:
            self.top_k = -1
        if self.seed == -1:  # vLLM's "no seed"
            self.seed = None
        if isinstance(self.structured_outputs, dict):  # vLLM's LLM accepts the dict form too
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self._verify()
        self.all_stop_token_ids = set(self.stop_token_ids)

    def _verify(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name} {why}, got {getattr(self, name)!r}.")

        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty",
                     "temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(name, "must be a number")
        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if self.n > 128:
            raise bad("n", "must be at most 128")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty < float("inf"):
            raise bad("repetition_penalty", "must be a finite number > 0")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", "must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "must be -1 (disable), 0 (disable), or at least 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "must be an integer")
        bad_max = not isinstance(self.max_tokens, int) or self.max_tokens < 1
        if self.max_tokens is not None and bad_max:
            raise bad("max_tokens", "must be at least 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be greater than or equal to 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}."
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", "must be in [0, 20]")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= 20:
            raise bad("prompt_logprobs", "must be in [0, 20]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "must hold non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must hold non-negative integers")
        if self.allowed_token_ids is not None and (not self.allowed_token_ids or any(
                not isinstance(t, int) or t < 0 for t in self.allowed_token_ids)):
            raise bad("allowed_token_ids", "must hold at least one token id >= 0")
        k = self.truncate_prompt_tokens
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k == 0 or k < -1):
            raise bad("truncate_prompt_tokens", "must be -1 (the context length) or >= 1")
        if not self.detokenize and self.stop:
            raise ValueError("stop strings need detokenize=True (the text is what they match).")
        for tok, bias in (self.logit_bias or {}).items():
            if tok < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {tok}.")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}.")

    @property
    def sampling_type(self) -> SamplingType:
        return SamplingType.GREEDY if self.temperature < _EPS else SamplingType.RANDOM

    def clone(self) -> SamplingParams:
        """An independent copy. Every field is a scalar or a list / dict / set of scalars, so
        copying those containers is a deep copy (``copy.deepcopy`` took ~23 us a request,
        this ~5)."""
        new = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, (list, dict, set)):
                setattr(new, name, value.copy())
        return new
