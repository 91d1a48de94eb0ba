"""IncrementalDetokenizer: deltas vs full decodes, split characters, stop strings, flush."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from edge_llm.engine.detokenizer import IncrementalDetokenizer
from edge_llm.sampling_params import SamplingParams

# a tokenizer directory; by default the demo model's (SmolLM2's byte-level BPE)
SMOL = os.environ.get("EDGE_LLM_TEST_TOKENIZER")
FFFD = "\ufffd"
TEXTS = [
    "Hello there, 世界! Emoji time: 😀🎉👍🏽 and 🇫🇷 flags. Ça va? naïve café — «quotes».",
    "日本語のテキストと한국어 텍스트, then Ελληνικά and русский текст. 🤖 says: 42 ≠ 43.",
    "Code: def f(x):\n    return x ** 2  # 平方\n\n\tTabs and  double  spaces ✓✓",
]
MODES = [True, False]  # use tokenizers' DecodeStream, or the Python window


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    if SMOL is None:
        from edge_llm.model.demo import ensure_demo_model

        return AutoTokenizer.from_pretrained(str(ensure_demo_model()))
    if not (Path(SMOL) / "tokenizer.json").exists():
        pytest.fail(f"EDGE_LLM_TEST_TOKENIZER={SMOL} has no tokenizer.json")
    return AutoTokenizer.from_pretrained(SMOL)


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk: int = 1) -> list[str]:
    """Feed ``ids`` ``chunk`` at a time until done; the deltas, flush included."""
    deltas = []
    for i in range(0, len(ids), chunk):
        deltas.append(detok.add(ids[i : i + chunk]))
        if detok.finished:
            break
    deltas.append(detok.flush())
    return deltas


def decode(tokenizer, ids, skip=True) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


# ---- no stop strings: deltas rebuild the full decode ---------------------------------------------
@pytest.mark.parametrize("use_stream", MODES)
@pytest.mark.parametrize("skip", [True, False])
def test_random_vocab_sequences_match_full_decode(tok, use_stream, skip, rng):
    torch.manual_seed(rng.randrange(2**32))  # the printed seed replays the draws
    vocab = len(tok)
    for _ in range(25):
        prompt = torch.randint(0, vocab, (int(torch.randint(0, 12, ())),)).tolist()
        out = torch.randint(0, vocab, (int(torch.randint(1, 60, ())),)).tolist()
        out[int(torch.randint(0, len(out), ()))] = tok.eos_token_id  # a special token inside
        params = SamplingParams(skip_special_tokens=skip)
        detok = IncrementalDetokenizer(tok, prompt, params, use_decode_stream=use_stream)
        assert detok.uses_decode_stream == use_stream
        chunk = int(torch.randint(1, 4, ()))
        assert "".join(stream(detok, out, chunk)) == decode(tok, out, skip)
        assert detok.text == decode(tok, out, skip)


@pytest.mark.parametrize("use_stream", MODES)
def test_real_text_split_characters_never_leak_replacement_chars(tok, use_stream):
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Say something."}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tok.encode(prompt)
    for text in TEXTS:
        ids = tok.encode(text)
        # the vocabulary splits multi-byte characters: some single tokens are partial bytes
        assert any(FFFD in decode(tok, [i]) for i in ids)
        detok = IncrementalDetokenizer(
            tok, prompt_ids, SamplingParams(), use_decode_stream=use_stream
        )
        deltas = stream(detok, ids)
        assert all(FFFD not in d for d in deltas)
        assert "".join(deltas) == decode(tok, ids) == text
        assert sum(1 for d in deltas if d == "") > 0  # something was held back on the way


def test_flush_emits_an_incomplete_character_like_a_full_decode(tok):
    ids = tok.encode("ok 😀")
    cut = next(n for n in range(1, len(ids)) if decode(tok, ids[:n]).endswith(FFFD))
    for use_stream in MODES:
        detok = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=use_stream)
        emitted = detok.add(ids[:cut])
        assert FFFD not in emitted
        assert emitted + detok.flush() == decode(tok, ids[:cut])
        with pytest.raises(RuntimeError):
            detok.add(ids[cut:])


def test_window_stays_small(tok):
    ids = tok.encode(" ".join(TEXTS) * 20)
    detok = IncrementalDetokenizer(tok, [], SamplingParams(), use_decode_stream=False)
    longest = 0
    for i in ids:
        detok.add([i])
        longest = max(longest, len(detok._stream._ids))
    assert longest <= 10  # the decoded window never grows with the output
    assert detok.text == decode(tok, ids)


# ---- stop strings --------------------------------------------------------------------------------
def check_stop_run(tok, text, stops, include, use_stream, chunk=1):
    ids = tok.encode(text)
    params = SamplingParams(stop=stops, include_stop_str_in_output=include)
    detok = IncrementalDetokenizer(tok, [], params, use_decode_stream=use_stream)
    emitted = ""
    held_back = False
    for i in range(0, len(ids), chunk):
        emitted += detok.add(ids[i : i + chunk])
        if detok.finished:
            break
        # what is not yet emitted is exactly a proper prefix of some stop string
        held = detok.text[len(emitted) :]
        assert detok.text.startswith(emitted)
        assert held == "" or any(s.startswith(held) and s != held for s in stops)
        held_back |= held != ""
    emitted += detok.flush()
    return emitted, detok, held_back


@pytest.mark.parametrize("use_stream", MODES)
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens_is_held_then_cut(tok, use_stream, include, rng):
    torch.manual_seed(rng.randrange(2**32))
    for text in TEXTS:
        ids = tok.encode(text)
        # a stop string that starts inside one token and ends inside a later one
        full = decode(tok, ids)
        starts = [len(decode(tok, ids[:n])) for n in range(len(ids) + 1)]
        a = int(torch.randint(len(full) // 3, 2 * len(full) // 3, ()))
        b = next(s for s in starts if s > a + 2) + 1
        stop = full[a:b]
        assert any(a < s < b for s in starts)  # this occurrence spans a token boundary
        emitted, detok, held_back = check_stop_run(tok, text, [stop], include, use_stream)
        first = full.index(stop)
        want = full[: first + len(stop)] if include else full[:first]
        assert emitted == want == detok.text
        assert detok.finished and detok.stop_reason == stop
        if any(first < s < first + len(stop) for s in starts):
            assert held_back  # the first part waited for the rest


@pytest.mark.parametrize("use_stream", MODES)
def test_stop_cut_does_not_depend_on_chunking(tok, use_stream):
    text = "The answer is 42. It is 42 indeed; a second answer."
    stops = ["42 indeed", "is 4", "answer."]  # "is 4" ends first
    results = set()
    for chunk in (1, 2, 3, 7, 100):
        emitted, detok, _ = check_stop_run(tok, text, stops, True, use_stream, chunk)
        results.add((emitted, detok.stop_reason))
    assert results == {("The answer is 4", "is 4")}


def test_stop_prefix_at_the_end_is_flushed(tok):
    for use_stream in MODES:
        emitted, detok, held_back = check_stop_run(
            tok, "We count to forty fo", ["four", "forty-two"], False, use_stream
        )
        assert held_back and not detok.finished and detok.stop_reason is None
        assert emitted == "We count to forty fo" == detok.text


def test_stop_strings_wait_for_min_tokens(tok):
    text = "stop here, then go on and stop again"
    ids = tok.encode(text)
    first_two = decode(tok, ids[:2])
    assert "stop" in first_two
    params = SamplingParams(stop=["stop"], min_tokens=2)
    detok = IncrementalDetokenizer(tok, [], params)
    emitted = "".join(stream(detok, ids))
    assert emitted == text[: text.index("stop", 1)]
    assert detok.stop_reason == "stop"


def test_stop_terminated_token_text_is_left_out(tok):
    ids = tok.encode("one two three.")
    for include in (False, True):
        params = SamplingParams(include_stop_str_in_output=include)
        detok = IncrementalDetokenizer(tok, [], params)
        emitted = detok.add(ids[:-1]) + detok.add(ids[-1:], stop_terminated=True)
        emitted += detok.flush()
        assert emitted == decode(tok, ids if include else ids[:-1])


# ---- SentencePiece-style tokenizer (Metaspace + byte fallback + Strip) ---------------------------
@pytest.fixture(scope="module")
def sp_tok():
    """A Llama-like tokenizer built in memory: '▁' for spaces, <0xNN> byte tokens for what the
    vocabulary lacks, and a decoder that strips the first leading space."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in list("abcdefghijklmnopqrstuvwxyz,.!?") + ["▁", "▁the", "▁a", "ing", "▁is"]:
        vocab[piece] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    raw.add_special_tokens(["<s>", "</s>"])
    return raw


@pytest.mark.parametrize("use_stream", MODES)
def test_sentencepiece_spaces_and_byte_fallback(sp_tok, use_stream):
    text = "the cat is singing 你好 ok, café!"
    ids = sp_tok.encode(text).ids
    assert sum(1 for i in ids if sp_tok.id_to_token(i).startswith("<0x")) >= 6  # bytes split
    prompt = sp_tok.encode("a prompt").ids
    detok = IncrementalDetokenizer(sp_tok, prompt, SamplingParams(), use_decode_stream=use_stream)
    deltas = stream(detok, ids)
    assert all(FFFD not in d for d in deltas)
    # in context the first word keeps its space, as in a decode of prompt + output
    want = sp_tok.decode(prompt + ids)[len(sp_tok.decode(prompt)) :]
    assert "".join(deltas) == want == " " + text
    no_prompt = IncrementalDetokenizer(sp_tok, [], SamplingParams(), use_decode_stream=use_stream)
    assert "".join(stream(no_prompt, ids)) == sp_tok.decode(ids) == text


def random_text(n: int) -> str:
    alphabet = list("abcdefghijklmnopqrstuvwxyz,.!? ") + ["the", "is", "ing", "é", "你", "😀", "  "]
    return "".join(alphabet[i] for i in torch.randint(0, len(alphabet), (n,)).tolist())


@pytest.mark.parametrize("use_stream", MODES)
def test_sentencepiece_random_sequences(sp_tok, use_stream, rng):
    """Random text (so byte tokens come in whole characters: a ByteFallback decoder turns a
    whole run of byte tokens into U+FFFD when the run is not valid UTF-8, which no stream can
    know in advance), random special tokens inside, random prompts."""
    torch.manual_seed(rng.randrange(2**32))
    for _ in range(40):
        prompt = sp_tok.encode(random_text(int(torch.randint(0, 10, ())))).ids
        out = sp_tok.encode(random_text(int(torch.randint(1, 30, ())))).ids
        for _ in range(int(torch.randint(0, 3, ()))):
            out.insert(int(torch.randint(0, len(out) + 1, ())), 2)  # </s>, skipped
        detok = IncrementalDetokenizer(
            sp_tok, prompt, SamplingParams(), use_decode_stream=use_stream
        )
        deltas = stream(detok, out)
        assert all(FFFD not in d for d in deltas)
        ctx = prompt[-5:]
        if sp_tok.decode(ctx).endswith(FFFD):
            ctx = []  # a prompt ending mid-character gives no context
        assert "".join(deltas) == sp_tok.decode(ctx + out)[len(sp_tok.decode(ctx)) :]
