"""FastTokenizer against transformers' AutoTokenizer: same backend state, ids, texts, special
tokens, chat prompts and streamed deltas on the demo tokenizer, the word-level benchmark
tokenizer and folders that stress the loading rules (tests/tokenizer_fixtures.py); which
folders fall back to transformers; loading without importing transformers."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm.engine.detokenizer import IncrementalDetokenizer
from edge_llm.engine.fast_tokenizer import FastTokenizer, fast_path_refusal
from edge_llm.engine.tokenizer import load_tokenizer
from edge_llm.sampling_params import SamplingParams
from tests.engine_fixtures import demo_dir  # noqa: F401 (fixture)
from tests.tokenizer_fixtures import (
    RICH_TEMPLATE,
    TOOL_TEMPLATE,
    metaspace_bpe_dir,
    special_map_dir,
    word_level_dir,
)

REPO = Path(__file__).resolve().parents[1]
KINDS = ["demo", "random_checkpoint", "metaspace", "special_map", "word_level"]
TEXTS = [
    "", " ", "  two leading", "trailing  ", "\n\n\t\r\n", "Hello, world!", "don't . , ! ? it's",
    "héllo wörld — «ça va?» naïve café", "日本語のテキストと한국어 텍스트", "Ελληνικά и русский",
    "emoji 👋🏽 family 👨‍👩‍👧 flag 🇫🇷", "e\u0301 combining \u200b zero width \ufeff bom",
    "<|im_start|>user\nhi<|im_end|>", "text<|im_end|>more<|endoftext|>", "<s> x </s> <tool>",
    " <tool> spaced <tool>x", "t1 t2 t3 t299 t300 t17", "[BOS] hello [EOS] [MASK] world",
    "hello world . , n't 's x café 日本", "def f(x):\n    return x ** 2  # 平方\n",
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "  4 "}, {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Quote <|im_end|> and <s> 日本 👋🏽", "name": "bob"},
     {"role": "assistant", "content": "ok", "tool_calls": None}],
    [{"role": "assistant", "content": "Starting first"}, {"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def folders(demo_dir, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    from benchmarks.random_checkpoint import write_tokenizer

    root = tmp_path_factory.mktemp("toks")
    write_tokenizer(root / "random_checkpoint", 300)
    return {"demo": demo_dir, "random_checkpoint": root / "random_checkpoint",
            "metaspace": metaspace_bpe_dir(root / "metaspace"),
            "special_map": special_map_dir(demo_dir, root / "special_map"),
            "word_level": word_level_dir(root / "word_level")}


@pytest.fixture(scope="module", params=KINDS)
def pair(request, folders):
    """(FastTokenizer, AutoTokenizer) of one folder."""
    from transformers import AutoTokenizer

    path = folders[request.param]
    assert fast_path_refusal(path) is None
    auto = AutoTokenizer.from_pretrained(str(path))
    auto.encode("x")  # transformers turns the file's truncation and padding off on first use
    return FastTokenizer.from_dir(path), auto


def _random_texts(tok, rng: random.Random, n: int) -> list[str]:
    pool = [*tok.all_special_tokens, *(t.content for t in tok.added_tokens_decoder.values())]
    pool += [tok.decode([rng.randrange(len(tok))]) for _ in range(64)]
    pool += list("aé日👋 \n\t.,!?'-") + ["  ", "\u0301", "\U0001f1eb"]
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 24))) for _ in range(n)]


def test_backend_and_special_tokens_match(pair):
    fast, auto = pair
    assert fast.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert fast.backend_tokenizer.encode_special_tokens == \
        auto.backend_tokenizer.encode_special_tokens
    assert fast.special_tokens_map == auto.special_tokens_map
    assert fast.all_special_tokens == auto.all_special_tokens
    assert fast.all_special_ids == auto.all_special_ids
    assert (len(fast), fast.vocab_size) == (len(auto), auto.vocab_size)
    assert fast.get_vocab() == auto.get_vocab()
    assert fast.added_tokens_encoder == auto.added_tokens_encoder
    for name in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        assert getattr(fast, f"{name}_token") == getattr(auto, f"{name}_token"), name
        assert getattr(fast, f"{name}_token_id") == getattr(auto, f"{name}_token_id"), name
    assert fast.chat_template == auto.chat_template
    assert fast.clean_up_tokenization_spaces == auto.clean_up_tokenization_spaces


def test_encode_matches(pair):
    fast, auto = pair
    texts = TEXTS + _random_texts(fast, random.Random(0), 150)
    for text in texts:
        for add in (True, False):
            assert fast.encode(text, add_special_tokens=add) == \
                auto.encode(text, add_special_tokens=add), (text, add)
        assert fast.tokenize(text) == auto.tokenize(text), text
    long = " ".join(["hello world"] * 40)  # longer than the word-level file's truncation
    assert fast.encode(long) == auto.encode(long)


def test_decode_and_token_conversions_match(pair):
    fast, auto = pair
    rng = random.Random(1)
    special = auto.all_special_ids
    for _ in range(300):
        ids = [rng.choice(special) if special and rng.random() < 0.15 else rng.randrange(len(fast))
               for _ in range(rng.randrange(0, 40))]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == \
                auto.decode(ids, skip_special_tokens=skip), (ids, skip)
        assert fast.decode(ids, clean_up_tokenization_spaces=True) == \
            auto.decode(ids, clean_up_tokenization_spaces=True)
        assert fast.convert_ids_to_tokens(ids, skip_special_tokens=True) == \
            auto.convert_ids_to_tokens(ids, skip_special_tokens=True)
        tokens = auto.convert_ids_to_tokens(ids)
        assert fast.convert_ids_to_tokens(ids) == tokens
        assert fast.convert_tokens_to_ids(tokens) == auto.convert_tokens_to_ids(tokens)
        assert fast.convert_tokens_to_string(tokens) == auto.convert_tokens_to_string(tokens)
    for i in [0, len(fast) - 1, *special]:
        assert fast.convert_ids_to_tokens(i) == auto.convert_ids_to_tokens(i)
        assert fast.decode(i) == auto.decode(i)
    batch = [[1, 2, 3], [len(fast) - 1], []]
    assert fast.decode(batch) == auto.decode(batch)
    assert fast.batch_decode(batch, skip_special_tokens=True) == \
        auto.batch_decode(batch, skip_special_tokens=True)
    assert fast.convert_tokens_to_ids("surely-not-a-token-🙃") == \
        auto.convert_tokens_to_ids("surely-not-a-token-🙃")


def _both(fast, auto, conv, **kw):
    """apply_chat_template(conv, **kw) on both: equal results, or the same exception type
    and message. Returns the fast one's ("ok", result) or (exception name, message)."""
    results = []
    for tok in (fast, auto):
        try:
            out = tok.apply_chat_template(conv, **kw)
            results.append(("ok", out if isinstance(out, (str, list)) else out["input_ids"]))
        except Exception as exc:  # noqa: BLE001 - compared below
            results.append((type(exc).__name__, str(exc)))
    if results[0][0] != "ok" or results[1][0] != "ok":
        assert results[0][0] == results[1][0], results
    else:
        assert results[0] == results[1]
    return results[0]


def test_chat_templates_match(pair):
    fast, auto = pair
    templates = [None, RICH_TEMPLATE]
    if isinstance(auto.chat_template, dict):
        templates += ["tool_use", "default"]
    rendered = 0
    for conv in CONVERSATIONS:
        for template in templates:
            if template is None and auto.chat_template is None:
                continue
            for gen in (True, False):
                kw = dict(chat_template=template, add_generation_prompt=gen)
                rendered += _both(fast, auto, conv, tokenize=False, **kw)[0] == "ok"
                _both(fast, auto, conv, tokenize=True, return_dict=False, **kw)
                _both(fast, auto, conv, **kw)  # transformers 5's default: a dict of ids
            _both(fast, auto, conv, chat_template=template, tokenize=False, tools=TOOLS,
                  extra_var="Z", bos_token="[b]")
            _both(fast, auto, conv, chat_template=template, tokenize=False,
                  continue_final_message=True)
    assert rendered >= len(CONVERSATIONS) * 2
    _both(fast, auto, CONVERSATIONS[0], chat_template=TOOL_TEMPLATE, tools=TOOLS, tokenize=False)
    bad = [{"role": "tool", "content": "x"}]
    assert _both(fast, auto, bad, chat_template=RICH_TEMPLATE, tokenize=False)[0] == \
        "TemplateError"


def test_streamed_deltas_match(pair):
    fast, auto = pair
    rng = random.Random(2)
    seqs = [fast.encode(t, add_special_tokens=False) for t in TEXTS if t]
    seqs += [[rng.randrange(len(fast)) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
    for ids in seqs:
        prompt = [rng.randrange(len(fast)) for _ in range(rng.randrange(0, 8))]
        stop = fast.decode(ids[2:4])
        params = SamplingParams(skip_special_tokens=rng.random() < 0.5,
                                stop=[stop] if stop and rng.random() < 0.3 else None)
        for use_stream in (True, False):
            out = []
            for tok in (fast, auto):
                detok = IncrementalDetokenizer(tok, prompt, params, use_decode_stream=use_stream)
                deltas = [detok.add([i]) for i in ids if not detok.finished]
                out.append((deltas, detok.flush(), detok.stop_reason))
            assert out[0] == out[1], (ids, prompt, use_stream)


def test_chat_template_override_and_no_template(folders, tmp_path):
    tok = load_tokenizer(folders["demo"], chat_template=RICH_TEMPLATE)
    assert isinstance(tok, FastTokenizer) and tok.chat_template == RICH_TEMPLATE
    file = tmp_path / "t.jinja"
    file.write_text(TOOL_TEMPLATE)
    tok = load_tokenizer(folders["demo"], chat_template=str(file))
    assert tok.chat_template == TOOL_TEMPLATE
    assert tok.apply_chat_template(CONVERSATIONS[0], tools=TOOLS, tokenize=False) == \
        "[get_weather]user: Hi there\n"
    bare = FastTokenizer.from_dir(folders["random_checkpoint"])
    with pytest.raises(ValueError, match="chat_template is not set"):
        bare.apply_chat_template(CONVERSATIONS[0], tokenize=False)
    with pytest.raises(ValueError, match="empty conversation"):
        FastTokenizer.from_dir(folders["demo"]).apply_chat_template([], tokenize=False)


def _copy_with(src: Path, dst: Path, config: dict | None = None, model: dict | None = None,
               drop: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name not in drop and f.suffix in (".json", ".jinja"):
            (dst / f.name).write_bytes(f.read_bytes())
    if config is not None:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        cfg.update(config)
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    if model is not None:
        (dst / "config.json").write_text(json.dumps(model))
    return dst


@pytest.mark.parametrize("change, reason", [
    (dict(drop=("tokenizer.json",)), "no tokenizer.json"),
    (dict(config={"auto_map": {"AutoTokenizer": ["x.Tok", None]}}), "auto_map"),
    (dict(config={"tokenizer_class": "GPT2Tokenizer"}), "GPT2Tokenizer"),
    (dict(config={"tokenizer_class": "LlamaTokenizerFast"}), "LlamaTokenizerFast"),
    (dict(model={"model_type": "qwen2"}), "qwen2"),
    (dict(config={"tokenizer_class": None}, model={"model_type": "llama"}), "None"),
])
def test_refusals(folders, tmp_path, change, reason):
    path = _copy_with(folders["demo"], tmp_path / "t", **change)
    assert reason in (fast_path_refusal(path) or "")


def test_fallback_loads_with_transformers(folders, tmp_path):
    path = _copy_with(folders["demo"], tmp_path / "t", config={"tokenizer_class": "GPT2Tokenizer"})
    tok = load_tokenizer(path)
    assert not isinstance(tok, FastTokenizer)
    assert tok.encode("Hello") == FastTokenizer.from_dir(folders["demo"]).encode("Hello")
    # a setting the fast path cannot read goes to transformers, which names the problem
    odd = _copy_with(folders["demo"], tmp_path / "odd", config={"bos_token": {"content": "x"}})
    assert fast_path_refusal(odd) is None
    with pytest.raises(ValueError, match="Unsupported special-token setting"):
        FastTokenizer.from_dir(odd)
    with pytest.raises(TypeError, match="bos_token"):
        load_tokenizer(odd)
    with pytest.raises(ValueError, match="not loadable without transformers"):
        FastTokenizer.from_dir(path)


def test_loading_does_not_import_transformers(folders):
    code = ("import sys; from pathlib import Path\n"
            "from edge_llm.engine.tokenizer import load_tokenizer\n"
            f"tok = load_tokenizer(Path({str(folders['demo'])!r}))\n"
            "text = tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False,"
            " add_generation_prompt=True)\n"
            "assert tok.decode(tok.encode(text)) == text\n"
            "assert 'transformers' not in sys.modules, 'transformers imported'\n"
            "print(type(tok).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "FastTokenizer"
