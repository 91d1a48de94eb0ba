"""Tool calls out of generated text, incrementally: the same parser serves whole replies and
streams (``feed`` each text delta, then ``finish``).

Formats:

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5,
  Qwen3, Hermes and many fine-tunes); text outside the blocks is content.
* ``llama3_json``: Llama 3.1 / 3.2 JSON calls, ``{"name": ..., "parameters": {...}}`` (several
  separated by ``;``), optionally after ``<|python_tag|>``, when the reply starts with them;
  any other reply is content.
* ``json_array``: what ``tool_choice: "required"`` constrains the output to,
  ``[{"name": ..., "parameters": {...}}, ...]``.
* ``named``: a named ``tool_choice``: the whole output is that function's arguments, streamed
  as argument fragments.

A call's first delta carries its index, id, type and name (the arguments in the same delta
when they are known whole), as the OpenAI API streams them; the official client's stream
accumulator rebuilds ``tool_calls`` from them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

PARSERS = ("hermes", "llama3_json")


@dataclass
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class Parsed:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: Parsed) -> Parsed:
        self.content += other.content
        self.calls += other.calls
        return self


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (text that
    may still become the tag, held back from a stream)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ToolParser:
    """Base: collects the calls; subclasses turn text into ``Parsed`` pieces. ``finish`` is
    a reply's last call: it releases what was held back and ends the parser."""

    def __init__(self, parallel: bool) -> None:
        self.calls: list[ToolCall] = []
        self.parallel = parallel

    def feed(self, text: str) -> Parsed:
        raise NotImplementedError

    def finish(self) -> Parsed:
        return Parsed()

    def _whole_call(self, obj: object) -> ToolCallDelta | None:
        """A complete call from a decoded JSON object, or None when it is not one."""
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                json.loads(args)
            except json.JSONDecodeError:
                return None
        elif not isinstance(args, dict):
            return None
        if self.calls and not self.parallel:
            return None  # parallel_tool_calls false: the first call only
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call = ToolCall(new_call_id(), obj["name"], text)
        self.calls.append(call)
        return ToolCallDelta(len(self.calls) - 1, call.id, call.name, text)


class HermesParser(ToolParser):
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, parallel: bool) -> None:
        super().__init__(parallel)
        self.buf = ""
        self.inside = False
        self.blank = ""  # whitespace-only content held until text follows it (or a call)

    def feed(self, text: str) -> Parsed:
        self.buf += text
        out = Parsed()
        while True:
            if self.inside:
                end = self.buf.find(self.CLOSE)
                if end < 0:
                    return out
                self._close(self.buf[:end], out, self.CLOSE)
                self.buf = self.buf[end + len(self.CLOSE):]
                continue
            start = self.buf.find(self.OPEN)
            if start < 0:
                keep = held_prefix(self.buf, self.OPEN)
                self._content(self.buf[: len(self.buf) - keep], out)
                self.buf = self.buf[len(self.buf) - keep:]
                return out
            self._content(self.buf[:start], out)
            self.buf = self.buf[start + len(self.OPEN):]
            self.inside = True

    def finish(self) -> Parsed:
        out = Parsed()
        if self.inside:  # an unterminated block: a call if it parses (EOS ended it)
            self._close(self.buf, out, "")
        else:
            self._content(self.buf, out)
        if not self.calls:
            out.content += self.blank
        return out

    def _close(self, body: str, out: Parsed, close: str) -> None:
        self.inside = False
        try:
            delta = self._whole_call(json.loads(body))
        except json.JSONDecodeError:
            delta = None
        if delta is not None:
            self.blank = ""
            out.calls.append(delta)
        elif not self.calls or self.parallel:
            self._content(self.OPEN + body + close, out)

    def _content(self, text: str, out: Parsed) -> None:
        """Trailing whitespace is held: dropped next to a call, sent before more text (so
        every chunking of a stream gives the same content)."""
        body = text.rstrip()
        if body:
            out.content += self.blank + body
            self.blank = ""
        self.blank += text[len(body):]


class Llama3JsonParser(ToolParser):
    TAG = "<|python_tag|>"

    def __init__(self, parallel: bool) -> None:
        super().__init__(parallel)
        self.buf = ""
        self.mode: str | None = None  # "json" or "text", decided by the first visible text
        self.pos = 0  # json mode: how much of buf was decoded into calls

    def feed(self, text: str) -> Parsed:
        if self.mode == "text":
            return Parsed(content=text)
        self.buf += text
        if self.mode is None:
            head = self.buf.lstrip()
            if not head or (len(head) < len(self.TAG) and self.TAG.startswith(head)):
                return Parsed()
            self.mode = "json" if head.startswith(("{", self.TAG)) else "text"
            if self.mode == "text":
                out, self.buf = Parsed(content=self.buf), ""
                return out
            self.buf = head.removeprefix(self.TAG)
        return self._decode()

    def _decode(self) -> Parsed:
        out = Parsed()
        dec = json.JSONDecoder()
        while True:
            rest = self.buf[self.pos:]
            skipped = len(rest) - len(rest.lstrip(" \t\r\n;"))
            try:
                obj, end = dec.raw_decode(self.buf, self.pos + skipped)
            except json.JSONDecodeError:
                return out
            delta = self._whole_call(obj)
            if delta is None and (self.parallel or not self.calls):
                self.mode = "bad"
                return out
            if delta is not None:
                out.calls.append(delta)
            self.pos = end

    def finish(self) -> Parsed:
        if not self.calls:  # undecided, text (buf sent already, so empty) or not calls after
            return Parsed(content=self.buf)  # all: the whole reply is content
        return Parsed()


class JsonArrayParser(ToolParser):
    """``tool_choice: "required"``: a JSON array of ``{"name", "parameters"}`` objects."""

    def __init__(self, parallel: bool) -> None:
        super().__init__(parallel)
        self.buf = ""
        self.pos = 0

    def feed(self, text: str) -> Parsed:
        self.buf += text
        out = Parsed()
        dec = json.JSONDecoder()
        while True:
            rest = self.buf[self.pos:]
            skipped = len(rest) - len(rest.lstrip(" \t\r\n[,"))
            try:
                obj, end = dec.raw_decode(self.buf, self.pos + skipped)
            except json.JSONDecodeError:
                return out
            delta = self._whole_call(obj)
            if delta is not None:
                out.calls.append(delta)
            self.pos = end


class NamedParser(ToolParser):
    """A named ``tool_choice``: the output is the arguments of ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__(False)
        self.name = name
        self.args = ""

    def feed(self, text: str) -> Parsed:
        out = Parsed()
        if not self.calls:
            self.calls.append(ToolCall(new_call_id(), self.name, ""))
            out.calls.append(ToolCallDelta(0, self.calls[0].id, self.name, ""))
        if text:
            self.args += text
            self.calls[0].arguments = self.args
            out.calls.append(ToolCallDelta(0, arguments=text))
        return out

    def finish(self) -> Parsed:
        return self.feed("")  # the call comes even when nothing was generated


def make_parser(kind: str, parallel: bool = True, name: str | None = None) -> ToolParser:
    if kind == "named":
        if not name:
            raise ValueError("a named tool_choice needs the function's name.")
        return NamedParser(name)
    classes = {"hermes": HermesParser, "llama3_json": Llama3JsonParser,
               "json_array": JsonArrayParser}
    return classes[kind](parallel)


def parser_of_template(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None when it has none."""
    if not template:
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("ipython" in template and "parameters" in template):
        return "llama3_json"
    return None
