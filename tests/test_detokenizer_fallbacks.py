"""IncrementalDetokenizer paths the real tokenizers rarely take: tokenizers' DecodeStream giving
up on an "invalid prefix", the flush of ids whose text does not extend the text before them,
and stop strings at the exact end of the ``min_tokens`` text. Tiny in-memory tokenizers make
each case exact: every token is a fixed piece of text (``Fuse`` joins them)."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models

from edge_llm.engine.detokenizer import IncrementalDetokenizer
from edge_llm.sampling_params import SamplingParams

PIECES = ["<unk>", "a", "b", "c", "st", "op", " ", "x", "s", "to", "p", "<0xC3>", "<0xA9>",
          "d", "e", "f", "g", "h"]
ID = {p: i for i, p in enumerate(PIECES)}


def pieces_tokenizer(replace_ab: bool = False) -> Tokenizer:
    """Each id decodes to its piece. ``replace_ab``: the decoder also rewrites "ab" as "X" —
    text that does not extend the text of its prefix ("a" then "X"), as a byte-fallback decoder
    does when a run of byte tokens stops being valid UTF-8."""
    tok = Tokenizer(models.WordLevel(vocab=ID, unk_token="<unk>"))
    # <0xC3> <0xA9> are the two bytes of "é": alone, each decodes as U+FFFD
    steps = [decoders.ByteFallback(), decoders.Fuse()]
    steps += [decoders.Replace("ab", "X")] if replace_ab else []
    tok.decoder = decoders.Sequence(steps)
    return tok


def ids(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


def feed(detok: IncrementalDetokenizer, token_ids: list[int]) -> list[str]:
    deltas = []
    for t in token_ids:
        deltas.append(detok.add([t]))
        if detok.finished:
            break
    deltas.append(detok.flush())
    return deltas


# ---- DecodeStream "invalid prefix": carry on with the Python window ------------------------


def test_invalid_prefix_falls_back_to_the_python_window(rng: random.Random) -> None:
    tok = pieces_tokenizer(replace_ab=True)
    out = ids("c", "a", "b", "c") + [rng.choice([1, 3, 7, 8]) for _ in range(8)]
    window = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=False)
    want = feed(window, out)
    detok = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=True)
    assert detok.uses_decode_stream
    got = [detok.add([t]) for t in out[:3]]
    assert detok.uses_decode_stream  # "ab" is held ("X" does not extend "a"): no error yet
    got.append(detok.add(out[3:4]))  # DecodeStream raises "Invalid prefix" here
    assert not detok.uses_decode_stream
    got += [detok.add([t]) for t in out[4:]] + [detok.flush()]
    assert got == want
    # the text after the failure comes through whole
    assert "".join(got).endswith(tok.decode(out[4:]))
    assert detok.text == "".join(got)


def test_invalid_prefix_with_a_prompt_context() -> None:
    tok = pieces_tokenizer(replace_ab=True)
    prompt = ids("x", "a")
    out = ids("b", "c", "c")
    deltas = {}
    for mode in (True, False):
        detok = IncrementalDetokenizer(tok, prompt, SamplingParams(), use_decode_stream=mode)
        deltas[mode] = feed(detok, out)
        assert not detok.uses_decode_stream
    assert deltas[True] == deltas[False]
    assert "".join(deltas[True]).endswith("cc")


# ---- flush: held ids whose text does not extend the text before them -----------------------


@pytest.mark.parametrize("use_stream", [True, False])
def test_flush_decodes_held_ids_alone_when_the_window_rewrites_its_prefix(use_stream) -> None:
    tok = pieces_tokenizer(replace_ab=True)
    detok = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=use_stream)
    assert detok.add(ids("c", "a")) == "ca"
    assert detok.add(ids("b")) == ""  # "caX" does not extend "ca": held
    assert detok.flush() == "b"  # the held id on its own, nothing emitted twice
    assert detok.text == "cab" and detok.flush() == ""


@pytest.mark.parametrize("use_stream", [True, False])
def test_flush_of_plain_text_is_the_rest_of_the_full_decode(use_stream) -> None:
    tok = pieces_tokenizer()
    detok = IncrementalDetokenizer(tok, ids("x"), SamplingParams(stop=["cab"]),
                                   use_decode_stream=use_stream)
    assert detok.add(ids("a", "c", "a")) == "a"  # "ca" may still become "cab"
    assert detok.flush() == "ca" and detok.text == "aca"
    with pytest.raises(RuntimeError, match="after the sequence finished"):
        detok.add(ids("b"))


def test_flush_with_nothing_held_is_empty() -> None:
    tok = pieces_tokenizer()
    for mode in (True, False):
        detok = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=mode)
        assert detok.add(ids("a", "b")) == "ab"
        assert detok.flush() == "" and detok.text == "ab"


# ---- stop strings and min_tokens: the boundary ---------------------------------------------


@pytest.mark.parametrize("use_stream", [True, False])
def test_stop_ending_exactly_at_the_min_tokens_text_does_not_count(use_stream) -> None:
    """vLLM's rule: a stop string counts only if it ends in the text of output token
    ``min_tokens + 1`` or later. "stop" ending with token 2 of min_tokens=2 is ignored; the next
    "stop" ends in token 4 and cuts the text."""
    tok = pieces_tokenizer()
    params = SamplingParams(stop=["stop"], min_tokens=2)
    detok = IncrementalDetokenizer(tok, [], params, use_decode_stream=use_stream)
    deltas = feed(detok, ids("st", "op", "a", "st", "op", "c"))
    # "st" may begin a stop string; "stop" at the floor no longer can: it is shown at once
    assert deltas[:3] == ["", "stop", "a"]
    assert "".join(deltas) == "stopa" and detok.stop_reason == "stop"
    assert detok.num_tokens == 5


@pytest.mark.parametrize("use_stream", [True, False])
def test_stop_ending_one_token_after_min_tokens_counts(use_stream) -> None:
    """A stop string that starts inside the min_tokens text but ends in the next token counts."""
    tok = pieces_tokenizer()
    for min_tokens, out, want in [
        (1, ids("st", "op", "c"), ""),
        (2, ids("a", "s", "to", "p"), "a"),  # "s" in token 2, "top" in tokens 3 and 4
        (3, ids("a", "s", "to", "p"), "a"),  # ends in token 4 = min_tokens + 1
        (4, ids("a", "s", "to", "p", "s", "to", "p"), "astop"),  # the first ends in token 4
    ]:
        params = SamplingParams(stop=["stop"], min_tokens=min_tokens)
        detok = IncrementalDetokenizer(tok, [], params, use_decode_stream=use_stream)
        assert "".join(feed(detok, out)) == want, (min_tokens, out)
        assert detok.stop_reason == "stop"


def test_min_tokens_floor_with_multi_token_adds() -> None:
    """Feeding several ids at once sets the floor at the min_tokens-th token's text, not at the
    end of the call."""
    tok = pieces_tokenizer()
    params = SamplingParams(stop=["stop"], min_tokens=2, include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tok, [], params)
    assert detok.add(ids("a", "st", "op", "st", "op")) == "astop"  # the floor: "ast"
    assert detok.stop_reason == "stop" and detok.text == "astop"


# ---- which tokenizers, and the default --------------------------------------------------


class DecodeOnly:
    """A tokenizer with only ``decode`` (a slow, pure-Python tokenizer), recording its calls."""

    def __init__(self, inner: Tokenizer, backend_tokenizer: object = None) -> None:
        self.inner = inner
        self.calls: list[dict] = []
        if backend_tokenizer is not None:
            self.backend_tokenizer = backend_tokenizer

    def decode(self, token_ids, **kwargs) -> str:
        self.calls.append(kwargs)
        return self.inner.decode(list(token_ids),
                                 skip_special_tokens=kwargs["skip_special_tokens"])


@pytest.mark.parametrize("backend", [None, "not a tokenizers.Tokenizer"])
@pytest.mark.parametrize("skip", [True, False])
def test_a_decode_only_tokenizer_uses_the_python_window(backend, skip: bool) -> None:
    tok = DecodeOnly(pieces_tokenizer(), backend)
    out = ids("a", "<0xC3>", "<0xA9>", "b", "st")
    detok = IncrementalDetokenizer(tok, ids("x"), SamplingParams(skip_special_tokens=skip))
    assert not detok.uses_decode_stream
    deltas = feed(detok, out)
    assert deltas == ["a", "", "é", "b", "st", ""] and detok.text == "aébst"
    assert tok.calls and all(c == {"skip_special_tokens": skip,
                                   "clean_up_tokenization_spaces": False} for c in tok.calls)


def test_a_tokenizer_without_decode_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^tokenizer must have a decode\(\) method, got "
                                        r"<class 'int'>\.$"):
        IncrementalDetokenizer(42, [], SamplingParams())


def test_rust_tokenizers_use_decode_stream_by_default() -> None:
    tok = pieces_tokenizer()
    assert IncrementalDetokenizer(tok, [], SamplingParams()).uses_decode_stream

    class Fast:  # what transformers' fast tokenizers expose
        backend_tokenizer = tok

    detok = IncrementalDetokenizer(Fast(), ids("x"), SamplingParams())
    assert detok.uses_decode_stream and feed(detok, ids("a", "b")) == ["a", "b", ""]


# ---- prompts ending mid-character, flush after a stop ----------------------------------------


@pytest.mark.parametrize("use_stream", [True, False])
def test_prompt_ending_mid_character_gives_no_context(use_stream) -> None:
    tok = pieces_tokenizer()
    prompt = ids("a", "<0xC3>")  # decodes as "a\ufffd"
    out = ids("<0xA9>", "b", "<0xC3>", "<0xA9>")
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(), use_decode_stream=use_stream)
    deltas = feed(detok, out)
    assert "".join(deltas) == tok.decode(out) == "\ufffdbé"
    assert deltas[0] == ""  # a lone continuation byte is held like any incomplete character


@pytest.mark.parametrize("use_stream", [True, False])
def test_flush_after_a_stop_string_adds_nothing(use_stream) -> None:
    tok = pieces_tokenizer()
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["stop"]),
                                   use_decode_stream=use_stream)
    assert detok.add(ids("a", "st", "op", "b", "<0xC3>")) == "a"  # "é" half-decoded, held
    assert detok.finished and detok.stop_reason == "stop"
    assert detok.flush() == "" and detok.text == "a"


@pytest.mark.parametrize("stops", [["bcdefg", "d"], ["d", "bcdefg"]])
def test_the_stop_string_that_ends_first_wins(stops: list[str]) -> None:
    """"bcdefg" starts first but "d" ends first: a token-by-token reader sees "d" first."""
    tok = pieces_tokenizer()
    for chunk in (1, 8):
        detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=stops))
        out = ids("a", "b", "c", "d", "e", "f", "g", "h")
        emitted = "".join(detok.add(out[i : i + chunk]) for i in range(0, 8, chunk)
                          if not detok.finished)
        assert emitted == "abc" and detok.stop_reason == "d"


def test_a_one_character_stop_at_the_very_start() -> None:
    tok = pieces_tokenizer()
    for mode in (True, False):
        detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["a"]),
                                       use_decode_stream=mode)
        assert detok.add(ids("a", "b")) == "" and detok.stop_reason == "a"


def test_the_stop_terminated_token_still_counts() -> None:
    """The EOS / stop id's text is left out, but it is an output token all the same."""
    tok = pieces_tokenizer()
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    assert detok.add(ids("a", "b")) == "ab" and detok.num_tokens == 2
    assert detok.add(ids("c", "x"), stop_terminated=True) == "c"
    assert detok.num_tokens == 4 and detok.text == "abc"


def test_add_after_the_end_is_refused() -> None:
    tok = pieces_tokenizer()
    message = r"^IncrementalDetokenizer\.add\(\) after the sequence finished\.$"
    detok = IncrementalDetokenizer(tok, [], SamplingParams(stop=["b"]))
    detok.add(ids("a", "b"))
    with pytest.raises(RuntimeError, match=message):
        detok.add(ids("c"))
    detok = IncrementalDetokenizer(tok, [], SamplingParams())
    detok.flush()
    with pytest.raises(RuntimeError, match=message):
        detok.add(ids("c"))


def test_a_stop_inside_min_tokens_is_shown_except_what_may_start_the_next_one() -> None:
    """"pop" ends at the min_tokens floor: it cannot count, but its last "p" may begin a "pop"
    that does, so only that "p" is held."""
    tok = pieces_tokenizer()
    for mode in (True, False):
        params = SamplingParams(stop=["pop"], min_tokens=2)
        detok = IncrementalDetokenizer(tok, [], params, use_decode_stream=mode)
        assert feed(detok, ids("p", "op", "a", "p", "op", "c")) == ["", "po", "pa", "", "", ""]
        assert detok.stop_reason == "pop" and detok.text == "popa"
