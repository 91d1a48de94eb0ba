"""The tool-call parsers delta by delta: what each ``feed`` and ``finish`` gives back (content,
and each call's index, id, name and arguments), what is and is not a call, and
``parallel_tool_calls: false``. Every chunking of a reply gives the same totals."""

from __future__ import annotations

import json
import re

import pytest

from edge_llm.server.tool_parsers import (
    Parsed,
    ToolCallDelta,
    held_prefix,
    make_parser,
    new_call_id,
    parser_of_template,
)


def _chunkings(text: str) -> list[list[str]]:
    """The whole text, one character at a time, and every split in two."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


def _run(kind: str, chunks: list[str], parallel: bool = True, name: str | None = None):
    """(content, [(index, name, arguments)], parser) of one reply fed in ``chunks``."""
    p = make_parser(kind, parallel, name)
    out = Parsed()
    for c in chunks:
        out.extend(p.feed(c))
    out.extend(p.finish())
    calls: dict[int, list] = {}
    for d in out.calls:
        entry = calls.setdefault(d.index, [None, None, ""])
        if d.id is not None:
            assert entry[0] is None, "a call's id comes once, in its first delta"
            entry[0] = d.id
        if d.name is not None:
            entry[1] = d.name
        entry[2] += d.arguments
    assert sorted(calls) == list(range(len(calls))), "indexes count from 0 without gaps"
    assert all(e[0] and re.fullmatch(r"call_[0-9a-f]{24}", e[0]) for e in calls.values())
    assert [(e[0], e[1], e[2]) for e in calls.values()] == [
        (c.id, c.name, c.arguments) for c in p.calls]  # deltas agree with the parser's list
    return out.content, [(i, e[1], e[2]) for i, e in sorted(calls.items())], p


def _same_for_every_chunking(kind: str, text: str, parallel: bool = True):
    want = _run(kind, [text], parallel)[:2]
    for chunks in _chunkings(text):
        assert _run(kind, chunks, parallel)[:2] == want, chunks
    return want


CALL_A = '{"name": "a", "arguments": {"city": "Zürich"}}'
CALL_B = '{"name": "b", "arguments": {}}'


@pytest.mark.parametrize("text, content, calls", [
    # text around the blocks is content; blanks next to a call are dropped
    (f"Sure.\n<tool_call>{CALL_A}</tool_call>\n\nDone.", "Sure.\n\nDone.",
     [(0, "a", '{"city": "Zürich"}')]),  # arguments keep non-ASCII text as it is
    (f"  <tool_call>{CALL_A}</tool_call>  ", "", [(0, "a", '{"city": "Zürich"}')]),
    (f"<tool_call>{CALL_B}</tool_call><tool_call>{CALL_A}</tool_call>", "",
     [(0, "b", "{}"), (1, "a", '{"city": "Zürich"}')]),
    # arguments may come as JSON text, or be missing (no arguments)
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "",
     [(0, "f", '{"x": 1}')]),
    ('<tool_call>{"name": "f"}</tool_call>', "", [(0, "f", "{}")]),
    ('<tool_call>{"name": "f", "parameters": {"y": 2}}</tool_call>', "",
     [(0, "f", '{"y": 2}')]),
    # not calls: the block stays in the content as it was written
    ('<tool_call>{"name": 5, "arguments": {}}</tool_call>',
     '<tool_call>{"name": 5, "arguments": {}}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
    ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>',
     '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', []),
    ('<tool_call>["f"]</tool_call>', '<tool_call>["f"]</tool_call>', []),
    # a block cut by the end of the reply: a call when it parses, else content
    ("Hm <tool_call>{\"name\": \"f\"", "Hm <tool_call>{\"name\": \"f\"", []),
    # whitespace-only replies and blanks inside content are kept
    ("\n\n", "\n\n", []),
    ("a  b\n", "a  b\n", []),
    ("x <tool_ca", "x <tool_ca", []),
    # an empty block is not a call, and it does not swallow the next one
    (f"<tool_call></tool_call> then <tool_call>{CALL_B}</tool_call>",
     "<tool_call></tool_call> then", [(0, "b", "{}")]),
])
def test_hermes(text, content, calls):
    assert _same_for_every_chunking("hermes", text) == (content, calls)


def test_hermes_streams_content_and_calls_as_they_complete():
    p = make_parser("hermes")
    assert p.feed("Hello <tool").content == "Hello"  # "<tool" may become <tool_call>
    assert p.feed("s> ").content == " <tools>"  # it did not; the blank waits for more text
    got = p.feed(f"<tool_call>{CALL_B}</tool_call> more")
    assert got.content == " more"  # the blank before the call is dropped
    assert [(d.index, d.name, d.arguments) for d in got.calls] == [(0, "b", "{}")]
    assert got.calls[0].id == p.calls[0].id
    assert p.finish() == Parsed()


def test_hermes_with_parallel_calls_off_keeps_only_the_first():
    text = (f"<tool_call>{CALL_A}</tool_call><tool_call>{CALL_B}</tool_call>"
            "<tool_call>not json</tool_call>")
    assert _same_for_every_chunking("hermes", text, parallel=False) == (
        "", [(0, "a", '{"city": "Zürich"}')])
    # before any call a block that is not one is still content
    assert _same_for_every_chunking("hermes", "<tool_call>no</tool_call>", parallel=False) == (
        "<tool_call>no</tool_call>", [])


@pytest.mark.parametrize("text, content, calls", [
    ('  <|python_tag|>{"name": "s", "parameters": {"q": "ü"}} ; {"name": "t"}', "",
     [(0, "s", '{"q": "ü"}'), (1, "t", "{}")]),
    ('\n{"name": "s", "parameters": {}}', "", [(0, "s", "{}")]),
    # a reply that does not start with a call is content, whatever follows
    ('Text {"name": "s", "parameters": {}}', 'Text {"name": "s", "parameters": {}}', []),
    (" <|python", " <|python", []),
    ("", "", []),
    ("   ", "   ", []),
    ("<|python_tag|>", "", []),  # the tag alone: an empty reply
    ('<|python_tag|> {"q": 1} x', ' {"q": 1} x', []),
    # JSON that is not a call: the reply is content (calls already made stay calls)
    ('{"name": "s"', '{"name": "s"', []),
    ('{"q": 1}; {"name": "s"}', '{"q": 1}; {"name": "s"}', []),
    ('{"name": "s"}; {"q": 1}; {"name": "t"}', "", [(0, "s", "{}")]),
])
def test_llama3_json(text, content, calls):
    assert _same_for_every_chunking("llama3_json", text) == (content, calls)


def test_llama3_json_streams_calls_and_text_as_they_complete():
    p = make_parser("llama3_json")
    assert p.feed(" <|python_") == Parsed()  # may still be the tag
    got = p.feed('tag|>{"name": "s"}; {"na')
    assert [(d.index, d.name, d.arguments) for d in got.calls] == [(0, "s", "{}")]
    assert [d.name for d in p.feed('me": "t"}').calls] == ["t"]
    assert p.finish() == Parsed()
    q = make_parser("llama3_json")
    assert q.feed("No").content == "No"
    assert q.feed(" call").content == " call"


def test_llama3_json_with_parallel_calls_off_keeps_only_the_first():
    text = '{"name": "s"}; {"q": 1}; {"name": "t"}'
    assert _same_for_every_chunking("llama3_json", text, parallel=False) == (
        "", [(0, "s", "{}")])
    # but JSON that is not a call before any call still makes the reply content
    text = '{"q": 1}; {"name": "s"}'
    assert _same_for_every_chunking("llama3_json", text, parallel=False) == (text, [])


def test_json_array_for_tool_choice_required():
    text = ' [ {"name": "a", "parameters": {"x": "é"}} , {"bad": 1}, {"name": "b"} ]'
    assert _same_for_every_chunking("json_array", text) == (
        "", [(0, "a", '{"x": "é"}'), (1, "b", "{}")])
    assert _same_for_every_chunking("json_array", text, parallel=False) == (
        "", [(0, "a", '{"x": "é"}')])


def test_named_tool_choice_streams_the_arguments():
    p = make_parser("named", name="lookup")
    first = p.feed('{"q": ')
    assert [(d.index, d.name, d.arguments) for d in first.calls] == [
        (0, "lookup", ""), (0, None, '{"q": ')]
    assert first.calls[0].id == p.calls[0].id and first.calls[1].id is None
    assert p.feed('"tea"}').calls == [ToolCallDelta(0, arguments='"tea"}')]
    assert p.feed("").calls == []
    assert p.finish() == Parsed()
    assert (p.calls[0].name, p.calls[0].arguments) == ("lookup", '{"q": "tea"}')
    # nothing generated: the call still comes, with empty arguments
    q = make_parser("named", name="ping")
    assert [(d.index, d.name, d.arguments) for d in q.finish().calls] == [(0, "ping", "")]
    assert (q.calls[0].name, q.calls[0].arguments) == ("ping", "")
    with pytest.raises(ValueError, match=r"^a named tool_choice needs the function's name\.$"):
        make_parser("named")
    assert json.loads('{"q": "tea"}')  # the streamed text is the arguments' JSON


def test_call_ids_are_unique_openai_style():
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


def test_held_prefix_is_the_longest_tail_that_may_become_the_tag():
    assert held_prefix("abc <tool_call", "<tool_call>") == len("<tool_call")
    assert held_prefix("<", "<tool_call>") == 1
    assert held_prefix("<tool_call>", "<tool_call>") == 0  # a whole tag is not held
    assert held_prefix("<<t", "<tool_call>") == 2
    assert held_prefix("", "<tool_call>") == 0
    assert held_prefix("abc", "<tool_call>") == 0


def test_the_format_is_picked_from_the_chat_template():
    assert parser_of_template("<tool_call>{{ tool }}</tool_call>") == "hermes"
    assert parser_of_template("<|python_tag|>") == "llama3_json"
    llama32 = "{%- if message.role == 'ipython' %}{{ tool['parameters'] }}"
    assert parser_of_template(llama32) == "llama3_json"
    assert parser_of_template("{{ 'ipython' }}") is None
    assert parser_of_template("{{ parameters }}") is None
    assert parser_of_template("") is None
    assert parser_of_template(None) is None
