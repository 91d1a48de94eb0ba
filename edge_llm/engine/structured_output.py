"""Constrained decoding with llguidance: constraints -> grammars -> per-sequence matchers.

``GrammarCompiler.compile`` turns a ``StructuredOutputsParams`` into an llguidance matcher for
the model's tokenizer (a constraint llguidance cannot enforce raises ValueError with its
message, which names the keyword, e.g. ``Unimplemented keys: ["not"]``); each sequence gets a
copy of it. Compiled constraints are cached (chat front ends send the same tool set with every
message). The llguidance tokenizer is built on first use from
the tokenizer's JSON (about 0.6 s for a 49k vocabulary on 2 CPU cores), so servers that never
see a constraint never pay for it.

``fill_bitmasks`` writes the allowed-token bitmask of each matcher (``[rows, ceil(V / 32)]``
int32, bit ``t % 32`` of word ``t // 32`` set when token t is allowed); the sampler applies it
(``sampler_logits.apply_token_bitmask``). A matcher advances in ``Sequence.append_token``, so
its state always matches the sequence's output tokens: preemption (swap or recompute) and
prefix-cache hits leave it as it is, and ``Sequence.fork`` gives each of ``n`` choices a copy.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask, fill_next_token_bitmask_par

from edge_llm.sampling_params import StructuredOutputsParams

# distinct constraints kept compiled (a grammar string is a few KB)
_CACHE_SIZE = 256


class CompiledGrammar:
    """One constraint compiled for one tokenizer: ``matcher()`` gives a fresh matcher, a copy
    of a template (a copy takes microseconds; compiling a 36-tool schema takes tens of ms)."""

    def __init__(self, template: llguidance.LLMatcher) -> None:
        self._template = template

    def matcher(self) -> llguidance.LLMatcher:
        return self._template.deep_copy()


class GrammarCompiler:
    """Compiled constraints for one tokenizer. ``vocab_size`` is the logits' width (it may
    exceed the tokenizer's: padded rows are never allowed); ``eos_token_ids`` are the tokens
    a grammar allows where it accepts."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids) or [tokenizer.eos_token_id]
        self._ll: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # the server compiles on its threads, the engine too

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll is None:
                backend = self._tokenizer.backend_tokenizer
                self._ll = llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size,
                                                  eos_token=self._eos)
            return self._ll

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """``spec`` compiled (cached); ValueError naming what llguidance refuses."""
        key = _cache_key(spec)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        template = llguidance.LLMatcher(self.ll_tokenizer, _to_grammar(spec), log_level=0)
        if template.is_error():
            raise ValueError(f"structured output ({spec.kind}) cannot be enforced: "
                             f"{template.get_error().strip()}")
        compiled = CompiledGrammar(template)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


# created on first parallel fill; a forked child makes its own, since its parent's threads do
# not exist there (the parent's executor would wait on them forever)
_executor: list[llguidance.LLExecutor] = []
os.register_at_fork(after_in_child=_executor.clear)


def fill_bitmasks(matchers: list[Any], vocab_size: int) -> np.ndarray:
    """``[len(matchers), ceil(vocab_size / 32)]`` int32 bitmasks of the matchers' next token;
    several are filled in parallel on llguidance's threads (the GIL released)."""
    masks = np.zeros((len(matchers), (vocab_size + 31) // 32), dtype=np.int32)
    if len(matchers) == 1:
        fill_next_token_bitmask(matchers[0], masks, 0)
        return masks
    if not _executor:
        _executor.append(llguidance.LLExecutor())
    fill_next_token_bitmask_par(_executor[0], [(m, i) for i, m in enumerate(matchers)], masks)
    return masks


def _cache_key(spec: StructuredOutputsParams) -> str:
    body = spec.json if isinstance(spec.json, str) or spec.json is None else json.dumps(
        spec.json, sort_keys=True)
    return json.dumps([spec.kind, body, spec.regex, spec.choice, spec.grammar,
                       spec.whitespace_flexible])


def _to_grammar(spec: StructuredOutputsParams) -> str:
    options = {"whitespace_flexible": spec.whitespace_flexible}
    kind = spec.kind
    if kind == "json":
        schema = spec.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured output (json): the schema is not JSON: {exc}"
                                 ) from None
        if schema is False:  # JSON Schema's `false` admits no value, so no reply can meet it
            raise ValueError("structured output (json): the schema false admits no output.")
        if schema is True:  # any JSON value; llguidance takes only object schemas
            schema = {}
        if not isinstance(schema, dict):
            raise ValueError("structured output (json): the schema must be a JSON object.")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"},
                                                             defaults=options)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c) for c in spec.choice)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    return llguidance.LLMatcher.grammar_from_lark(_lark_of(spec.grammar))


def _lark_of(grammar: str) -> str:
    """llama.cpp's GBNF (``root ::= ...``) converted to Lark; Lark passes as it is."""
    if "::=" in grammar:
        try:
            return llguidance.gbnf_to_lark.gbnf_to_lark(grammar)
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions
            raise ValueError(f"structured output (grammar): bad GBNF grammar: {exc}") from None
    return grammar
