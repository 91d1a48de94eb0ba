"""Defaults for what a request leaves out (``--default-max-tokens``, ``--generation-config``)
through the real HTTP layer over the fake engine, plus the file reader's refusals. The same
flags against a real ``edge-llm serve`` are in ``test_first_hour_e2e.py``."""

from __future__ import annotations

import json

import pytest
from litestar.testing import AsyncTestClient

from edge_llm.config import DEFAULT_MAX_TOKENS
from edge_llm.server.request_defaults import (
    generation_config_file,
    read_generation_config,
    resolve_request_defaults,
)
from tests.test_server_fake_engine import FakeEngine, make_app

pytestmark = pytest.mark.anyio
HI = [{"role": "user", "content": "Hi"}]


def gen_dir(tmp_path, **values):
    (tmp_path / "generation_config.json").write_text(json.dumps(values))
    return tmp_path


# every word of the fake's scripts holds one of these: a reply ends at its first token, however
# many tokens it was allowed
STOP_AT_ONCE = ["a", "e", "i", "u"]


async def sent_params(engine, body, path="/v1/chat/completions", **server_kw):
    async with AsyncTestClient(make_app(engine, **server_kw)) as c:
        r = await c.post(path, json={"stop": STOP_AT_ONCE, **body})
        assert r.status_code == 200, r.text
    return engine.requests[-1][1]


async def test_chat_without_max_tokens_gets_the_bounded_default(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts, max_model_len=8192)
    params = await sent_params(engine, {"messages": HI})
    assert params.max_tokens == DEFAULT_MAX_TOKENS
    # the operator's bound; 0 is vLLM's "rest of the context"
    params = await sent_params(engine, {"messages": HI}, default_max_tokens=7)
    assert params.max_tokens == 7
    params = await sent_params(engine, {"messages": HI}, default_max_tokens=0)
    prompt_len = len(engine.requests[-1][0])
    assert params.max_tokens == 8192 - prompt_len
    # the client's own value always wins, above the default too
    params = await sent_params(engine, {"messages": HI, "max_tokens": 2000},
                               default_max_tokens=7)
    assert params.max_tokens == 2000
    params = await sent_params(engine, {"messages": HI, "max_completion_tokens": 3})
    assert params.max_tokens == 3


async def test_default_is_capped_by_the_context_left(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts, max_model_len=256)
    params = await sent_params(engine, {"messages": HI})
    assert params.max_tokens == 256 - len(engine.requests[-1][0]) < DEFAULT_MAX_TOKENS


async def test_completions_keep_openais_16(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts, max_model_len=8192)
    params = await sent_params(engine, {"prompt": "Once"}, "/v1/completions",
                               default_max_tokens=7)
    assert params.max_tokens == 16


async def test_generation_config_auto_path_and_vllm(fake_tokenizer, token_scripts, tmp_path):
    folder = gen_dir(tmp_path, temperature=0.3, top_p=0.8, top_k=5, min_p=0.05,
                     repetition_penalty=1.1, max_new_tokens=9, do_sample=True)
    engine = FakeEngine(fake_tokenizer, token_scripts, max_model_len=8192)
    engine.model_path = folder  # "auto" reads the model folder
    params = await sent_params(engine, {"messages": HI})
    assert (params.temperature, params.top_p, params.top_k, params.min_p,
            params.repetition_penalty, params.max_tokens) == (0.3, 0.8, 5, 0.05, 1.1, 9)
    # a field the request sends wins; the rest still come from the file
    params = await sent_params(engine, {"messages": HI, "temperature": 0.9, "top_k": -1})
    assert (params.temperature, params.top_k, params.top_p) == (0.9, -1, 0.8)
    # the completions endpoint takes the sampling defaults too
    params = await sent_params(engine, {"prompt": "Once"}, "/v1/completions")
    assert (params.temperature, params.top_p) == (0.3, 0.8)
    # vllm: the file is ignored; the flag's bound wins over the file's max_new_tokens
    params = await sent_params(engine, {"messages": HI}, generation_config="vllm")
    assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, -1)
    assert params.max_tokens == DEFAULT_MAX_TOKENS
    params = await sent_params(engine, {"messages": HI}, default_max_tokens=4)
    assert params.max_tokens == 4 and params.temperature == 0.3
    # an explicit folder, for an engine whose own folder has none
    other = FakeEngine(fake_tokenizer, token_scripts, max_model_len=8192)
    params = await sent_params(other, {"messages": HI}, generation_config=str(folder))
    assert params.temperature == 0.3 and params.max_tokens == 9


def test_reader_refusals_name_the_file_and_key(tmp_path):
    with pytest.raises(ValueError, match="no generation_config.json"):
        generation_config_file(str(tmp_path / "missing"), None)
    assert generation_config_file("vllm", tmp_path) is None
    assert generation_config_file("auto", tmp_path) is None  # a model without the file
    for values, key in (({"temperature": "hot"}, "temperature"), ({"top_k": 2.5}, "top_k"),
                        ({"max_new_tokens": 0}, "max_new_tokens"), ({"top_p": True}, "top_p")):
        path = gen_dir(tmp_path, **values) / "generation_config.json"
        with pytest.raises(ValueError, match=rf"generation_config.json: {key}"):
            read_generation_config(path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        read_generation_config(tmp_path / "generation_config.json")


def test_values_sampling_refuses_are_refused_at_load(tmp_path):
    folder = gen_dir(tmp_path, top_p=1.5)
    with pytest.raises(ValueError, match=r"generation_config.json: top_p"):
        resolve_request_defaults("auto", folder, None)


def test_resolution_logs_what_applies(tmp_path, caplog):
    folder = gen_dir(tmp_path, temperature=0.2, top_p=0.9)
    with caplog.at_level("INFO", logger="edge_llm.server"):
        defaults = resolve_request_defaults("auto", folder, None)
    assert defaults.sampling == {"temperature": 0.2, "top_p": 0.9}
    assert defaults.max_tokens == DEFAULT_MAX_TOKENS
    text = caplog.text
    assert f"at most {DEFAULT_MAX_TOKENS} tokens" in text and "temperature=0.2" in text
    assert resolve_request_defaults("auto", folder, 0).max_tokens is None
