"""GrammarCompiler and fill_bitmasks as their callers see them: which tokens a constraint
allows (read from the bitmask), which constraints share a compiled entry, what the cache
keeps, and the layout of the masks (padded vocabularies, widths not a multiple of 32)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_llm.engine import structured_output
from edge_llm.engine.structured_output import GrammarCompiler, fill_bitmasks
from edge_llm.engine.tokenizer import load_tokenizer
from edge_llm.sampling_params import StructuredOutputsParams as SO
from tests.engine_fixtures import demo_dir  # noqa: F401

VOCAB = 49152  # the demo tokenizer's size


@pytest.fixture(scope="module")
def tok(demo_dir):  # noqa: F811
    return load_tokenizer(demo_dir)


def _other_eos(tok) -> int:
    """A second end-of-sequence id (models such as Llama 3 have several)."""
    return tok.eos_token_id + 1 if tok.eos_token_id + 1 < VOCAB else 0


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok, VOCAB, [_other_eos(tok), tok.eos_token_id])


def _allowed(masks: np.ndarray, row: int = 0) -> set[int]:
    """Token ids whose bit is set in one row (bit t % 32 of word t // 32)."""
    bits = np.unpackbits(masks[row].view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _first(tok, text: str) -> int:
    return _ids(tok, text)[0]


def _after(compiler, spec: SO, tok, text: str) -> set[int]:
    """Tokens allowed after ``text`` was generated under ``spec``."""
    m = compiler.compile(spec).matcher()
    assert m.consume_tokens(_ids(tok, text)), text
    return _allowed(fill_bitmasks([m], compiler.vocab_size))


def test_each_kind_allows_what_it_describes(compiler, tok):
    start = {name: _allowed(fill_bitmasks([compiler.compile(s).matcher()], VOCAB)) for name, s in
             [("object", SO(json_object=True)), ("choice", SO(choice=["yes", "no"])),
              ("regex", SO(regex="[0-9]+")), ("lark", SO(grammar='start: "ab" | "cd"')),
              ("gbnf", SO(grammar='root ::= "ab" | "cd"')),
              ("schema", SO(json={"type": "array", "items": {"type": "integer"}})),
              ("schema_text", SO(json='{"type": "array", "items": {"type": "integer"}}'))]}
    assert _first(tok, "{") in start["object"] and _first(tok, "[") not in start["object"]
    assert {_first(tok, "yes"), _first(tok, "no")} <= start["choice"]
    assert _first(tok, "maybe") not in start["choice"]
    assert _first(tok, "7") in start["regex"] and _first(tok, "a") not in start["regex"]
    for grammar in ("lark", "gbnf"):  # GBNF converts to the same language as its Lark form
        assert _first(tok, "ab") in start[grammar] and _first(tok, "x") not in start[grammar]
    assert start["gbnf"] == start["lark"]
    assert _first(tok, "[") in start["schema"] and _first(tok, "{") not in start["schema"]
    assert start["schema_text"] == start["schema"]  # a schema may come as its JSON text
    assert fill_bitmasks([compiler.compile(SO(regex="a")).matcher()], VOCAB).shape == (
        1, VOCAB // 32)


def test_eos_is_allowed_exactly_where_the_grammar_accepts(compiler, tok):
    default = GrammarCompiler(tok, VOCAB, [])  # none given: the tokenizer's own
    for c, eos in ((compiler, {_other_eos(tok), tok.eos_token_id}), (default, {tok.eos_token_id})):
        start = _allowed(fill_bitmasks([c.compile(SO(choice=["yes"])).matcher()], VOCAB))
        assert start and not start & eos  # not accepting yet: no EOS
        assert _after(c, SO(choice=["yes"]), tok, "yes") == eos


def test_compact_and_flexible_json_whitespace(compiler, tok):
    space = {t for t in range(VOCAB) if tok.decode([t]).isspace()}
    flexible = SO(json={"type": "object"}, whitespace_flexible=True)
    compact = SO(json={"type": "object"})
    for spec in (flexible, compact, flexible):  # the cache keeps them apart either way
        got = _after(compiler, spec, tok, "{") & space
        assert bool(got) == spec.whitespace_flexible
    for spec in (SO(json_object=True, whitespace_flexible=True), SO(json_object=True)):
        assert bool(_after(compiler, spec, tok, "{") & space) == spec.whitespace_flexible


def test_equal_constraints_share_one_compiled_entry(tok):
    c = GrammarCompiler(tok, VOCAB, [tok.eos_token_id])
    a = c.compile(SO(json={"type": "object", "properties": {"x": {"type": "integer"}}}))
    b = c.compile(SO(json={"properties": {"x": {"type": "integer"}}, "type": "object"}))
    assert a is b  # the same schema with its keys in another order
    kinds = [SO(regex="ab"), SO(choice=["ab"]), SO(grammar='start: "ab"'),
             SO(json={"const": "ab"}), SO(json_object=True)]
    assert len({id(c.compile(s)) for s in kinds}) == len(kinds)
    m1, m2 = a.matcher(), a.matcher()  # each sequence's own state
    assert m1.consume_tokens(_ids(tok, "{"))
    assert _allowed(fill_bitmasks([m2], VOCAB)) != _allowed(fill_bitmasks([m1], VOCAB))


def test_the_cache_keeps_the_most_recently_used(tok, monkeypatch):
    monkeypatch.setattr(structured_output, "_CACHE_SIZE", 2)
    c = GrammarCompiler(tok, VOCAB, [tok.eos_token_id])
    a, b = c.compile(SO(regex="a+")), c.compile(SO(regex="b+"))
    assert c.compile(SO(regex="a+")) is a  # a hit, now the most recent
    c.compile(SO(regex="c+"))  # over the bound: b, the least recently used, goes
    assert c.compile(SO(regex="a+")) is a
    assert c.compile(SO(regex="b+")) is not b


def test_masks_cover_a_padded_vocabulary(tok):
    for vocab in (VOCAB + 8,):  # logits wider than the tokenizer, not a multiple of 32
        c = GrammarCompiler(tok, vocab, [tok.eos_token_id])
        one = fill_bitmasks([c.compile(SO(regex=".+")).matcher()], vocab)
        assert one.shape == (1, -(-vocab // 32)) and one.dtype == np.int32
        allowed = _allowed(one)
        assert allowed and max(allowed) < VOCAB  # padded rows are never allowed
        two = fill_bitmasks([c.compile(SO(regex="[0-9]")).matcher(),
                             c.compile(SO(regex=".+")).matcher()], vocab)
        assert two.shape == (2, one.shape[1])
        assert np.array_equal(two[1], one[0])  # the parallel fill puts each row in its place
        assert _allowed(two, 0) < allowed


def test_refusals_say_which_constraint_failed(compiler):
    with pytest.raises(ValueError, match=r"^structured output \(regex\) cannot be enforced: \S"):
        compiler.compile(SO(regex="a(b"))
    for schema in ("[1, 2]", "5", '"text"'):
        with pytest.raises(ValueError, match=r"^structured output \(json\): the schema must be "
                                             r"a JSON object\.$"):
            compiler.compile(SO(json=schema))
    with pytest.raises(ValueError, match=r"^structured output \(json\): the schema is not "
                                         r"JSON: Expecting"):
        compiler.compile(SO(json="{oops"))
    with pytest.raises(ValueError, match=r"^structured output \(grammar\): bad GBNF grammar: "):
        compiler.compile(SO(grammar="root ::= ("))
    with pytest.raises(ValueError, match=r"^structured output \(json\): the schema false admits "
                                         r"no output\.$"):
        compiler.compile(SO(json=False))


def test_the_schema_true_allows_any_json_value(compiler, tok):
    for schema in (True, "true"):
        first = _allowed(fill_bitmasks([compiler.compile(SO(json=schema)).matcher()], VOCAB))
        assert {_first(tok, "{"), _first(tok, "["), _first(tok, "7"), _first(tok, '"')} <= first
        assert _first(tok, "a") not in first

