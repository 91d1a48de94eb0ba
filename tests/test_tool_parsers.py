"""Tool-call and reasoning parsers on scripted model outputs, whole and streamed in random
chunkings: every chunking gives the same content, reasoning and calls as the whole text."""

from __future__ import annotations

import json
import random

import pytest

from edge_llm.server.chat_reply import ReplyReader, call_deltas, read_whole
from edge_llm.server.chat_tools import ToolPlan
from edge_llm.server.preprocess import ChatPlan
from edge_llm.server.reasoning_parsers import ReasoningParser
from edge_llm.server.tool_parsers import held_prefix, parser_of_template

SCRIPTS = [  # (tool parser, reasoning parser, output, content, reasoning, [(name, args)])
    ("hermes", None,
     'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     "Let me check.", "", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ("hermes", None, "No tools needed: 2 < 3 and <b>bold</b>.",
     "No tools needed: 2 < 3 and <b>bold</b>.", "", []),
    ("hermes", None, '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}',  # EOS, no close
     "", "", [("f", {"x": 1})]),
    ("hermes", None, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> "
     "after", "", []),
    ("hermes", "qwen3",
     '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Oslo"}}\n</tool_call>',
     "", "\nThe user wants weather.\n", [("get_weather", {"city": "Oslo"})]),
    ("llama3_json", None,
     '<|python_tag|>{"name": "search", "parameters": {"q": "llm"}}; '
     '{"name": "get_time", "parameters": {"tz": "UTC"}}',
     "", "", [("search", {"q": "llm"}), ("get_time", {"tz": "UTC"})]),
    ("llama3_json", None, '{"name": "search", "parameters": {"q": "a b"}}', "", "",
     [("search", {"q": "a b"})]),
    ("llama3_json", None, "The answer is {42}.", "The answer is {42}.", "", []),
    ("llama3_json", None, '{"not": "a call"}', '{"not": "a call"}', "", []),
    (None, "deepseek_r1", "First think. Then </think>\n\nAnswer.", "Answer.",
     "First think. Then ", []),
    (None, "deepseek_r1", "<think>only thinking, cut", "", "only thinking, cut", []),
    (None, "qwen3", "Plain reply, no thinking.", "Plain reply, no thinking.", "", []),
]


def _plan(tools: str | None, reasoning: str | None) -> ChatPlan:
    mode = "auto" if tools else "none"
    return ChatPlan(ToolPlan(mode, tools, None, True, [{"type": "function"}]), reasoning)


def _chunks(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        j = i + rng.randint(1, 7)
        out.append(text[i:j])
        i = j
    return out


def _stream(plan: ChatPlan, text: str, rng: random.Random, prompt: str | None = None):
    reader = ReplyReader(plan, prompt)
    content = reasoning = ""
    calls: dict[int, dict] = {}
    pieces = [reader.feed(c) for c in _chunks(text, rng)] + [reader.finish()]
    for r, parsed in pieces:
        reasoning += r
        content += parsed.content
        for d in call_deltas(parsed) or []:  # rebuilt as a client's accumulator does
            entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                entry["id"] = d.id
            if d.function is not None:
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
    return content, reasoning, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{s[0]}-{s[1]}-{i}"
                                                 for i, s in enumerate(SCRIPTS)])
def test_scripted_outputs_whole_and_in_random_chunkings(script, rng):
    tools, reasoning_kind, text, content, reasoning, calls = script
    plan = _plan(tools, reasoning_kind)
    got_content, got_reasoning, got_calls, reader = read_whole(plan, None, text)
    want_content = None if calls and not content.strip() else content
    assert got_content == want_content
    assert (got_reasoning or "") == reasoning
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got_calls] == calls
    assert len({c.id for c in got_calls}) == len(got_calls)
    assert reader.finish_reason("stop") == ("tool_calls" if calls else "stop")
    assert reader.finish_reason("length") == "length"
    for _ in range(25):
        s_content, s_reasoning, s_calls = _stream(plan, text, rng)
        assert s_content == content
        assert s_reasoning == reasoning
        assert [(c["name"], json.loads(c["arguments"])) for c in s_calls] == calls
        assert all(c["id"].startswith("call_") for c in s_calls)


def test_required_json_array_and_named_arguments_stream(rng):
    required = ChatPlan(ToolPlan("required", None, None, True, [{}]))
    text = '[{"name": "a", "parameters": {"x": [1, 2]}}, {"name": "b", "parameters": {}}]'
    for _ in range(20):
        content, _, calls = _stream(required, text, rng)
        assert content == ""
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
            ("a", {"x": [1, 2]}), ("b", {})]
    named = ChatPlan(ToolPlan("named", None, "lookup", False, [{}]))
    args = '{"query": "tea", "limit": 3}'
    for _ in range(20):
        content, _, calls = _stream(named, args, rng)
        assert content == "" and len(calls) == 1
        assert calls[0]["name"] == "lookup" and calls[0]["arguments"] == args


def test_parallel_tool_calls_false_keeps_the_first_call():
    plan = ChatPlan(ToolPlan("auto", "hermes", None, False, [{}]))
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    _, _, calls, _ = read_whole(plan, None, text)
    assert [c.function.name for c in calls] == ["a"]


def test_reasoning_opened_by_the_prompt(rng):
    plan = ChatPlan(ToolPlan(), "qwen3")
    prompt = "<|im_start|>assistant\n<think>\n"
    for _ in range(10):
        content, reasoning, _ = _stream(plan, "step 1, step 2</think>\n\nDone.", rng, prompt)
        assert (reasoning, content) == ("step 1, step 2", "Done.")
    with pytest.raises(ValueError, match="reasoning parser"):
        ReasoningParser("nope")


def test_formats_detected_from_chat_templates():
    assert parser_of_template("{% for t in tools %}<tool_call>{{ t }}</tool_call>") == "hermes"
    assert parser_of_template("<|python_tag|>{{ x }}") == "llama3_json"
    assert parser_of_template("{{ '<|im_start|>' + message['role'] }}") is None
    assert parser_of_template(None) is None
    assert held_prefix("text <tool_c", "<tool_call>") == len("<tool_c")
    assert held_prefix("text <b>", "<tool_call>") == 0
