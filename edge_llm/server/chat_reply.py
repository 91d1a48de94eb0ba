"""A chat choice's text read back as OpenAI's message: reasoning (``reasoning_content``), tool
calls and content, from the whole text or delta by delta (the same parsers either way)."""

from __future__ import annotations

from .preprocess import ChatPlan
from .protocol import FunctionCall, FunctionDelta, ToolCallDeltaOut, ToolCallOut
from .reasoning_parsers import ReasoningParser
from .tool_parsers import Parsed, ToolCall, make_parser


class ReplyReader:
    """One choice's reader: ``feed`` text deltas, then ``finish``; each returns
    (reasoning text, ``Parsed`` content and tool-call deltas)."""

    def __init__(self, plan: ChatPlan, prompt_text: str | None) -> None:
        self.reasoning = (ReasoningParser(plan.reasoning, prompt_text)
                          if plan.reasoning else None)
        tp = plan.tools
        kind = {"required": "json_array", "named": "named"}.get(tp.mode, tp.parser)
        self.tools = make_parser(kind, tp.parallel, tp.name) if tp.parses and kind else None

    def feed(self, text: str) -> tuple[str, Parsed]:
        reasoning, content = self.reasoning.feed(text) if self.reasoning else ("", text)
        return reasoning, self._content(content)

    def finish(self) -> tuple[str, Parsed]:
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        parsed = self._content(content)
        if self.tools is not None:
            parsed.extend(self.tools.finish())
        return reasoning, parsed

    def _content(self, text: str) -> Parsed:
        if self.tools is None:
            return Parsed(content=text)
        return self.tools.feed(text) if text else Parsed()

    @property
    def calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools is not None else []

    def finish_reason(self, reason: str | None) -> str | None:
        """``tool_calls`` for a reply that ended normally with calls, as OpenAI reports it."""
        return "tool_calls" if reason == "stop" and self.calls else reason


def read_whole(plan: ChatPlan, prompt_text: str | None, text: str
               ) -> tuple[str | None, str | None, list[ToolCallOut], ReplyReader]:
    """(content, reasoning_content, tool_calls, reader) of a finished choice's text."""
    reader = ReplyReader(plan, prompt_text)
    r1, p1 = reader.feed(text)
    r2, p2 = reader.finish()
    content = p1.content + p2.content
    reasoning = r1 + r2
    calls = [ToolCallOut(c.id, FunctionCall(c.name, c.arguments)) for c in reader.calls]
    if calls and not content.strip():
        content = None
    return content, (reasoning or None) if reader.reasoning else None, calls, reader


def call_deltas(parsed: Parsed) -> list[ToolCallDeltaOut] | None:
    """OpenAI's streamed tool-call deltas: the first one of a call with its id, type and
    name, later ones with argument fragments only."""
    out = []
    for d in parsed.calls:
        if d.id is not None:
            out.append(ToolCallDeltaOut(d.index, d.id, "function",
                                        FunctionDelta(d.name, d.arguments)))
        else:
            out.append(ToolCallDeltaOut(d.index, function=FunctionDelta(arguments=d.arguments)))
    return out or None
