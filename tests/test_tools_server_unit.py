"""The chat route's tool-call and reasoning handling on scripted model outputs (a fake engine
replays the tokens): ``auto`` parsing with the server's parser flags, whole and streamed, the
stream rebuilt by the official client's accumulator, and the flags' checks."""

from __future__ import annotations

import json

import pytest
from litestar.testing import AsyncTestClient
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from edge_llm.config import ServerConfig
from tests.test_server_fake_engine import FakeEngine, make_app, sse_payloads

pytestmark = pytest.mark.anyio

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
REPLY = ('<think>The user wants the weather.</think>\n\nLet me look.\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>END')


def _body(stream: bool, **extra) -> dict:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL],
            "max_tokens": 200, "stop": ["END"], "stream": stream, **extra}


async def _run(tokenizer, script: str, server_kw: dict, stream: bool, **extra):
    engine = FakeEngine(tokenizer, [tokenizer.encode(script, add_special_tokens=False)])
    async with AsyncTestClient(make_app(engine, **server_kw)) as c:
        r = await c.post("/v1/chat/completions", json=_body(stream, **extra))
        assert r.status_code == 200, r.text
        if not stream:
            return r.json()
        state = ChatCompletionStreamState()
        for payload in sse_payloads(r.text):
            state.handle_chunk(ChatCompletionChunk.model_validate(payload))
        return state.get_final_completion().model_dump()


@pytest.mark.parametrize("stream", [False, True])
async def test_hermes_calls_and_reasoning_with_the_parser_flags(fake_tokenizer, stream):
    body = await _run(fake_tokenizer, REPLY, dict(tool_call_parser="hermes",
                                                  reasoning_parser="qwen3"), stream)
    (choice,) = body["choices"]
    msg = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert msg["content"] == "Let me look."
    assert msg["reasoning_content"] == "The user wants the weather."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True])
async def test_without_parsers_the_text_comes_back_as_it_is(fake_tokenizer, stream):
    body = await _run(fake_tokenizer, REPLY, dict(tool_call_parser="none",
                                                  reasoning_parser="none"), stream)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == REPLY[: -len("END")]
    assert not choice["message"].get("tool_calls")


async def test_tool_choice_none_reads_no_calls(fake_tokenizer):
    body = await _run(fake_tokenizer, REPLY, dict(tool_call_parser="hermes",
                                                  reasoning_parser="none"), False,
                      tool_choice="none")
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "<tool_call>" in body["choices"][0]["message"]["content"]


async def test_tool_history_reaches_the_template(fake_tokenizer):
    engine = FakeEngine(fake_tokenizer, [fake_tokenizer.encode("ok", add_special_tokens=False)])
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {
                       "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18 C"}]
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/chat/completions", json={"messages": history, "max_tokens": 2,
                                                       "tools": [TOOL]})
    assert r.status_code == 200, r.text
    prompt = fake_tokenizer.decode(engine.requests[0][0])
    assert "get_weather" in prompt and "Oslo" in prompt and "sunny, 18 C" in prompt


@pytest.mark.parametrize("kw,needle", [(dict(tool_call_parser="xml"), "tool_call_parser"),
                                       (dict(reasoning_parser="r2"), "reasoning_parser")])
def test_parser_flags_are_checked(kw, needle):
    with pytest.raises(ValueError, match=needle):
        ServerConfig(**kw)
