"""ReasoningParser as a stream: what each delta gives back, not only the totals.

A streaming client shows reasoning and content as they arrive, so text that can no longer
become a tag is released by the ``feed`` that completes it, and every chunking of a reply (one
piece, one character at a time, any split in two) gives the same totals as the whole reply.
"""

from __future__ import annotations

import pytest

from edge_llm.server.reasoning_parsers import ReasoningParser, parser_of_template


def _feed_all(kind: str, chunks: list[str], prompt: str | None = None):
    """(deltas of each feed, delta of finish) of one reply."""
    p = ReasoningParser(kind, prompt)
    return [p.feed(c) for c in chunks], p.finish()


def _totals(kind: str, chunks: list[str], prompt: str | None = None) -> tuple[str, str]:
    deltas, last = _feed_all(kind, chunks, prompt)
    pairs = deltas + [last]
    return "".join(r for r, _ in pairs), "".join(c for _, c in pairs)


def _chunkings(text: str) -> list[list[str]]:
    """The whole text, one character at a time, and every split in two."""
    return ([[text], list(text)]
            + [[text[:i], text[i:]] for i in range(1, len(text))])


CASES = [  # (parser, prompt, reply, reasoning, content)
    # only the reply's one leading <think> is a tag; a literal one later is reasoning text
    ("qwen3", None, "<think><think> is how I start</think>ok", "<think> is how I start", "ok"),
    ("deepseek_r1", None, "I see the tag <think> in the input</think>\n\nAnswer.",
     "I see the tag <think> in the input", "Answer."),
    ("deepseek_r1", None, "<think>\nplan</think>Answer.", "\nplan", "Answer."),
    # the first </think> ends the reasoning; a later one is content
    ("qwen3", None, "<think>a</think>b</think>c", "a", "b</think>c"),
    ("deepseek_r1", None, "a</think>\nb</think>c", "a", "b</think>c"),
    # the newlines after </think> are dropped, nothing else: spaces and letters stay
    ("qwen3", None, "<think>x</think>\n\n  indented", "x", "  indented"),
    ("qwen3", None, "<think>x</think>\nXML is text", "x", "XML is text"),
    ("deepseek_r1", None, "x</think>\n\nXX marks", "x", "XX marks"),
    # a reply cut inside the reasoning, even inside a partial </think>, is all reasoning
    ("deepseek_r1", None, "thinking </thi", "thinking </thi", ""),
    ("qwen3", None, "<think>thinking </", "thinking </", ""),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "half </think", "half </think", ""),
    # a reply that is only the opening tag has neither reasoning nor content
    ("qwen3", None, "<think>", "", ""),
    ("deepseek_r1", None, "<think>", "", ""),
    # qwen3 without <think> is content as it is, whitespace included
    ("qwen3", None, "Hi", "", "Hi"),
    ("qwen3", None, "\n\n", "", "\n\n"),
    ("qwen3", None, "<thin> is not the tag", "", "<thin> is not the tag"),
    # deepseek_r1 reasoning needs no opening tag
    ("deepseek_r1", None, "Hi</think>Yo", "Hi", "Yo"),
]


@pytest.mark.parametrize("kind, prompt, reply, reasoning, content", CASES)
def test_every_chunking_gives_the_same_split(kind, prompt, reply, reasoning, content):
    for chunks in _chunkings(reply):
        assert _totals(kind, chunks, prompt) == (reasoning, content), chunks


def test_content_is_released_as_it_arrives():
    p = ReasoningParser("qwen3")
    assert p.feed("<think>") == ("", "")
    assert p.feed("step one") == ("step one", "")
    assert p.feed("</think>\n\nHel") == ("", "Hel")
    assert p.feed("lo") == ("", "lo")
    assert p.finish() == ("", "")


def test_reasoning_is_released_as_it_arrives_and_partial_tags_are_held():
    p = ReasoningParser("deepseek_r1")
    assert p.feed("Hi") == ("Hi", "")
    assert p.feed(" <t") == (" <t", "")  # "<t" cannot become "</think>"
    assert p.feed("ag> </th") == ("ag> ", "")  # "</th" may still become it
    assert p.feed("ink>") == ("", "")
    assert p.feed("\n") == ("", "")  # the newlines after </think> belong to neither
    assert p.feed("Yes") == ("", "Yes")


def test_a_plain_qwen3_reply_streams_without_delay():
    p = ReasoningParser("qwen3")
    assert p.feed("  ") == ("", "")  # leading blanks may still precede <think>
    assert p.feed("<th") == ("", "")  # may still become <think>
    assert p.feed("e") == ("", "  <the")
    assert p.feed(" end") == ("", " end")
    q = ReasoningParser("qwen3")
    assert q.feed("Hi") == ("", "Hi")  # too short to be <think>, but not a prefix of it


def test_prompt_opened_reasoning_and_unknown_parsers():
    p = ReasoningParser("qwen3", "<|im_start|>assistant\n<think>\n")
    assert p.feed("why") == ("why", "")
    assert ReasoningParser("qwen3", "<|im_start|>assistant\n").feed("hi") == ("", "hi")
    assert ReasoningParser("qwen3", "").feed("hi") == ("", "hi")
    with pytest.raises(ValueError, match="deepseek_r1"):
        ReasoningParser("qwen")


def test_the_parser_is_picked_from_the_chat_template():
    assert parser_of_template("{{ '<think>' + r + '</think>' }}") == "qwen3"
    assert parser_of_template("{{ '<|im_start|>' + message['role'] }}") is None
    assert parser_of_template("") is None
    assert parser_of_template(None) is None
