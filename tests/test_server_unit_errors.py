"""HTTP-layer unit tests of failures: invalid values, malformed bodies, engine failures, auth,
a full queue, disconnects, loading and load failures, over the fake engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from litestar.testing import AsyncTestClient

from edge_llm.server.terminal_chat import ThreadedServer
from tests.test_server_fake_engine import FakeEngine, assert_error, make_app, sse_payloads

pytestmark = pytest.mark.anyio

_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("body, status, param", [
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 7}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": 10**30}, 400, "seed"),
    ({"messages": [{"role": "user", "content": "x"}], "n": "two"}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}, 400,
     "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999": 1}}, 400,
     "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, 400, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model"),
    # answers this server cannot give are refused, not silently replaced by plain text
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "xml"}}, 400, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}, 400,
     "response_format"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
     "tools[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, 400,
     "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [_TOOL],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "mirostat": 2}, 400, "mirostat"),
    ({"messages": [{"role": "user", "content": "x"}], "guided_regex": "a",
      "guided_choice": ["b"]}, 400, "guided_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "functions": [_TOOL["function"]]}, 400,
     "functions"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]},
     400, "messages[1].tool_calls"),
    # vLLM's chat extras that are not served, or cannot go together
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, 400, "echo"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x }}"}, 400,
     "chat_template"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 1}, 400,
     "prompt_logprobs"),
    # vLLM refuses a priority without --scheduling-policy priority; scheduling here is FCFS
    ({"messages": [{"role": "user", "content": "x"}], "priority": -1}, 400, "priority"),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, 400,
     "continue_final_message"),
    ({"messages": [{"role": "user", "content": "x"}],
      "chat_template_kwargs": {"add_generation_prompt": False}}, 400, "chat_template_kwargs"),
    # as OpenAI and vLLM: stream options only with stream
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
     400, "stream_options"),
    # a missing required field is named
    ({}, 400, "messages"),
    ({"model": "fake-model"}, 400, "messages"),
    # the field that asked for too many tokens is named
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10**6}, 400,
     "max_completion_tokens"),
])
async def test_chat_invalid_values_are_openai_errors(fake_tokenizer, token_scripts, body, status,
                                                     param):
    async with AsyncTestClient(make_app(FakeEngine(fake_tokenizer, token_scripts))) as c:
        assert_error(await c.post("/v1/chat/completions", json=body), status, param)
        ok = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert ok.status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": [-1, 2]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "stop_token_ids": [10**8]}, "stop_token_ids"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "n": 2, "best_of": 1}, "best_of"),
    ({"prompt": "x " * 300}, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # allowed with echo only
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "prompt_logprobs": 2}, "prompt_logprobs"),
    ({"prompt": "x", "priority": 3}, "priority"),
    ({"max_tokens": 2}, "prompt"),
])
async def test_completion_invalid_values(fake_tokenizer, token_scripts, body, param):
    async with AsyncTestClient(make_app(FakeEngine(fake_tokenizer, token_scripts))) as c:
        err = assert_error(await c.post("/v1/completions", json=body), 400, param)
    if body.get("prompt") == "x " * 300:
        assert "256" in err["message"] and "301" in err["message"]


async def test_supported_forms_of_the_refused_fields_are_served(fake_tokenizer, token_scripts):
    """The plain-text forms: response_format text, tools with tool_choice none, and tools
    with tool_choice auto on a template without a tool format (a plain reply, never a 400:
    Open WebUI attaches tools to every chat), best_of equal to n."""
    msgs = [{"role": "user", "content": "x"}]
    async with AsyncTestClient(make_app(FakeEngine(fake_tokenizer, token_scripts))) as c:
        for extra in ({"response_format": {"type": "text"}},
                      {"tools": [_TOOL], "tool_choice": "none"},
                      {"tools": [_TOOL]}, {"tools": [_TOOL], "tool_choice": "auto"},
                      {"functions": [_TOOL["function"]], "function_call": "none"},
                      {"priority": 0}, {"priority": None}):
            r = await c.post("/v1/chat/completions",
                             json={"messages": msgs, "max_tokens": 2, **extra})
            assert r.status_code == 200, (extra, r.text)
            assert r.json()["choices"][0]["message"]["content"]
        r = await c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 2,
                                                  "best_of": 2})
        assert r.status_code == 200 and len(r.json()["choices"]) == 2


async def test_malformed_bodies_routes_and_size_are_openai_errors(fake_tokenizer, token_scripts):
    app = make_app(FakeEngine(fake_tokenizer, token_scripts), max_body_bytes=4096)
    raw = {"content-type": "application/json"}
    async with AsyncTestClient(app) as c:
        assert_error(await c.post("/v1/chat/completions", content=b"{bad json", headers=raw), 400)
        assert_error(await c.post("/v1/chat/completions", content=b"", headers=raw), 400)
        assert_error(await c.post("/v1/chat/completions", content=b"[1, 2]", headers=raw), 400)
        bad_utf8 = b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'
        assert_error(await c.post("/v1/chat/completions", content=bad_utf8, headers=raw), 400)
        deep = b'{"messages": ' + b"[" * 1900 + b"]" * 1900 + b"}"
        assert_error(await c.post("/v1/chat/completions", content=deep, headers=raw), 400)
        big = json.dumps({"prompt": "x" * 10000}).encode()
        assert_error(await c.post("/v1/completions", content=big, headers=raw), 413)
        err = assert_error(await c.get("/v1/nothing-here"), 404)
        assert err["type"] == "invalid_request_error"  # OpenAI's type for a 404
        err = assert_error(await c.get("/v1/chat/completions"), 405)
        assert "method" in err["message"].lower()
        assert_error(await c.delete("/health"), 405)
        assert (await c.get("/health")).status_code == 200


async def test_engine_failure_is_500_then_server_goes_on(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine)) as c:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        engine.fail_at_step = 0
        err = assert_error(await c.post("/v1/chat/completions", json=body), 500)
        assert "simulated engine failure" in err["message"]
        stream = await c.post("/v1/chat/completions", json={**body, "stream": True})
        assert stream.status_code == 500  # failed before the first token: a real status
        engine.fail_at_step = 2  # after the first token: an error event, then [DONE]
        stream = await c.post("/v1/chat/completions", json={**body, "stream": True})
        assert stream.status_code == 200
        events = sse_payloads(stream.text)
        assert "simulated engine failure" in events[-1]["error"]["message"]
        engine.fail_at_step = None
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200


async def test_api_key_guards_v1_only(fake_tokenizer, token_scripts):
    app = make_app(FakeEngine(fake_tokenizer, token_scripts), api_key="s3cret-key")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with AsyncTestClient(app) as c:
        assert_error(await c.post("/v1/chat/completions", json=body), 401)
        assert_error(await c.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert_error(await c.post("/v1/completions", content=b"{bad",
                                  headers={"Content-Type": "application/json"}), 401)
        auth = {"Authorization": "Bearer s3cret-key"}
        assert (await c.post("/v1/chat/completions", json=body, headers=auth)).status_code == 200
        assert (await c.get("/v1/models", headers=auth)).json()["data"][0]["id"] == "fake-model"
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200


async def test_queue_full_is_429_with_retry_after_over_real_http(fake_tokenizer, token_scripts):
    # AsyncTestClient runs requests one at a time: concurrency needs a real server
    engine = FakeEngine(fake_tokenizer, token_scripts, step_delay=0.05)
    app = make_app(engine, max_num_seqs=2, max_queue=1)
    server = ThreadedServer(app)
    server.start()
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            results = await asyncio.gather(*[c.post("/v1/chat/completions", json=body)
                                             for _ in range(6)])
            assert sorted(r.status_code for r in results) == [200, 200, 200, 429, 429, 429]
            for r in results:
                if r.status_code == 429:
                    assert_error(r, 429)
                    assert int(r.headers["retry-after"]) >= 0
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
    finally:
        server.stop()


async def test_disconnect_mid_stream_aborts_and_frees(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts, step_delay=0.05)
    app = make_app(engine)
    server = ThreadedServer(app)
    server.start()
    holder = app.state.ctx.holder
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            body = {"prompt": "count", "max_tokens": 200, "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        break  # leave after the first event
            for _ in range(100):
                if not engine.active and holder.in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            assert engine.active == {} and holder.in_flight == 0
            assert len(engine.aborted) == 1 and engine.aborted[0].startswith("cmpl-")
            r = await c.post("/v1/completions", json={"prompt": "again", "max_tokens": 2})
            assert r.status_code == 200
    finally:
        server.stop()


async def test_loading_health_503_and_requests_wait(fake_tokenizer, token_scripts):
    app = make_app(FakeEngine(fake_tokenizer, token_scripts), load_delay=0.6)
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with AsyncTestClient(app) as c:
        err = assert_error(await c.get("/health"), 503)
        assert "loading" in err["message"]
        r = await c.post("/v1/chat/completions", json=body)  # waits for the load
        assert r.status_code == 200
        assert (await c.get("/health")).json() == {"status": "ok"}


async def test_load_timeout_and_failure_are_503(fake_tokenizer, token_scripts):
    slow = make_app(FakeEngine(fake_tokenizer, token_scripts), load_delay=1.0, ready_timeout=0.1)
    async with AsyncTestClient(slow) as c:
        r = await c.get("/v1/models")
        assert_error(r, 503) and r.headers["retry-after"]
    broken = make_app(None, fail_load=OSError("no weights in /nowhere"))
    async with AsyncTestClient(broken) as c:
        await asyncio.sleep(0.2)
        assert "no weights" in assert_error(await c.get("/health"), 503)["message"]
        assert "no weights" in assert_error(await c.get("/v1/models"), 503)["message"]
