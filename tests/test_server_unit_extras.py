"""HTTP-layer unit tests of the fields OpenAI and vLLM clients send beyond the basics, over the
fake engine: ``null`` for optional fields, vLLM's ``continue_final_message`` and
``chat_template_kwargs``, ``stream_options.continuous_usage_stats``, and prompt scoring with
``echo`` and ``max_tokens`` 0."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from tests.test_server_fake_engine import FakeEngine, make_app, sse_payloads

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "What is the capital of France?"}]


async def test_null_means_the_default(fake_tokenizer, token_scripts):
    """Clients that send every field, unset ones as null, are served with the defaults."""
    engine = FakeEngine(fake_tokenizer, token_scripts)
    nulls = {k: None for k in ("n", "stream", "stream_options", "presence_penalty",
                               "frequency_penalty", "min_tokens", "ignore_eos",
                               "skip_special_tokens", "include_stop_str_in_output",
                               "temperature", "top_p", "stop", "seed", "user")}
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": USER, "max_tokens": 3, "logprobs": None, "top_logprobs": None,
            "add_generation_prompt": None, "continue_final_message": None, **nulls})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 1 and r.json()["choices"][0]["logprobs"] is None
        r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "echo": None,
                                                  "logprobs": None, **nulls})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/chat/completions", json={
            "messages": USER, "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": None, "continuous_usage_stats": None}})
        assert r.status_code == 200 and all(ch.get("usage") is None
                                            for ch in sse_payloads(r.text))
    for _, params in engine.requests:
        assert (params.n, params.presence_penalty, params.frequency_penalty, params.min_tokens,
                params.ignore_eos, params.skip_special_tokens,
                params.include_stop_str_in_output) == (1, 0.0, 0.0, 0, False, True, False)


async def test_continue_final_message_prefills_the_reply(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    prefill = [*USER, {"role": "assistant", "content": "The capital of France is"}]
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": prefill, "max_tokens": 2, "add_generation_prompt": False,
            "continue_final_message": True})
        assert r.status_code == 200, r.text
        r = await c.post("/v1/chat/completions", json={"messages": prefill, "max_tokens": 2})
        assert r.status_code == 200, r.text
    continued = fake_tokenizer.decode(engine.requests[0][0])
    assert continued.endswith("<|im_start|>assistant\nThe capital of France is"), continued
    reopened = fake_tokenizer.decode(engine.requests[1][0])
    assert reopened.endswith("The capital of France is<|im_end|>\n<|im_start|>assistant\n")


async def test_chat_template_kwargs_reach_the_template(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    template = ("{% if formal %}Dear model.{% endif %}{% for m in messages %}"
                "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    async with AsyncTestClient(make_app(engine, chat_template=template)) as c:
        for kwargs in ({"formal": True}, {"formal": False}, None):
            r = await c.post("/v1/chat/completions", json={
                "messages": USER, "max_tokens": 2, "chat_template_kwargs": kwargs})
            assert r.status_code == 200, r.text
    texts = [fake_tokenizer.decode(ids) for ids, _ in engine.requests]
    assert texts[0].startswith("Dear model.user: What")
    assert texts[1].startswith("user: What") and texts[2].startswith("user: What")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_continuous_usage_stats(fake_tokenizer, token_scripts, path):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    body = {"messages": USER} if "chat" in path else {"prompt": "Say something"}
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post(path, json={**body, "max_tokens": 5, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": True}})
        assert r.status_code == 200, r.text
    chunks = sse_payloads(r.text)
    prompt_len = len(engine.requests[0][0])
    usages = [ch["usage"] for ch in chunks]
    assert all(u["prompt_tokens"] == prompt_len for u in usages)
    assert all(u["total_tokens"] == prompt_len + u["completion_tokens"] for u in usages)
    done = [u["completion_tokens"] for u in usages]
    assert done == sorted(done) and done[-1] == 5  # grows with the text, ends at the total
    assert chunks[-1]["choices"] == []


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_max_tokens_0_scores_the_prompt(fake_tokenizer, token_scripts, stream):
    """vLLM's echo without generation: the prompt alone comes back, finished by length, with
    no completion tokens counted (the engine runs one token, which is left out)."""
    engine = FakeEngine(fake_tokenizer, token_scripts)
    prompts = ["The sky is", "Grass is"]
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/completions", json={
            "prompt": prompts, "max_tokens": 0, "echo": True, "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {})})
        assert r.status_code == 200, r.text
    if stream:
        chunks = sse_payloads(r.text)
        choices = [ch["choices"][0] for ch in chunks if ch["choices"]]
        usage = chunks[-1]["usage"]
    else:
        choices, usage = r.json()["choices"], r.json()["usage"]
    assert sorted((ch["index"], ch["text"], ch["finish_reason"]) for ch in choices) == [
        (0, prompts[0], "length"), (1, prompts[1], "length")]
    assert [p.max_tokens for _, p in engine.requests] == [1, 1]
    assert usage["completion_tokens"] == 0
    assert usage["prompt_tokens"] == usage["total_tokens"] == sum(
        len(ids) for ids, _ in engine.requests)


async def test_truncate_prompt_tokens_and_allowed_token_ids_reach_the_engine(fake_tokenizer,
                                                                              token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    ids = list(range(300, 340))
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/completions", json={
            "prompt": ids, "max_tokens": 2, "truncate_prompt_tokens": 5,
            "allowed_token_ids": [7, 8, 9]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 5
        r = await c.post("/v1/chat/completions", json={
            "messages": USER, "max_tokens": 2, "truncate_prompt_tokens": 3})
        assert r.status_code == 200, r.text
        for body, param in (({"prompt": ids, "truncate_prompt_tokens": 0},
                             "truncate_prompt_tokens"),
                            ({"prompt": ids, "allowed_token_ids": [10**7]},
                             "allowed_token_ids")):
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    (prompt, params), (chat_prompt, _) = engine.requests
    assert prompt == ids[-5:] and params.allowed_token_ids == [7, 8, 9]
    assert len(chat_prompt) == 3
