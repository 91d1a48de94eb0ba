"""What a request asks of the output's shape, read from every field that asks for one:
structured outputs (OpenAI's ``response_format``, vLLM's ``structured_outputs`` / ``guided_*``,
llama.cpp's ``json_schema`` / ``grammar``) and tools (``tools``, ``tool_choice``,
``parallel_tool_calls``), each turned into a ``StructuredOutputsParams`` and a ``ToolPlan``.

``tool_choice``:

* ``none``: a plain reply; the template still sees no tools.
* ``auto``: the model decides; its own tool-call format (``tool_parsers.py``) is parsed out
  of the reply when the chat template teaches one (or ``--tool-call-parser`` names one).
  A model or template without a tool format gets a plain reply, never an error (front ends
  such as Open WebUI attach tools to every chat).
* ``required``: the output is constrained to a JSON array of calls to the given tools (at
  most one with ``parallel_tool_calls: false``), each call's arguments to its schema.
* a named function: the output is constrained to that function's arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edge_llm.sampling_params import StructuredOutputsParams

from .errors import bad_request
from .protocol import ChatCompletionRequest, SamplingFields


@dataclass
class ToolPlan:
    """How the reply is read: ``mode`` none / auto / required / named; ``parser`` the format
    ``auto`` parses (None: a plain reply); ``name`` the named function."""

    mode: str = "none"
    parser: str | None = None
    name: str | None = None
    parallel: bool = True
    tools: list[dict[str, Any]] = field(default_factory=list)  # as the template gets them

    @property
    def parses(self) -> bool:
        return self.mode in ("required", "named") or (self.mode == "auto"
                                                      and self.parser is not None)


def structured_spec(req: SamplingFields) -> tuple[StructuredOutputsParams | None, str | None]:
    """The request's output constraint and the field that asked for it; 400 when two fields
    ask, or one is malformed."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt.type == "json_schema":
            js = fmt.json_schema
            if js is None or js.schema is None:
                raise bad_request("response_format json_schema needs json_schema.schema.",
                                  "response_format")
            found.append(("response_format", {"json": js.schema}))
        else:
            raise bad_request(f"response_format type must be 'text', 'json_object' or "
                              f"'json_schema', got {fmt.type!r}.", "response_format")
    for name, key in (("guided_json", "json"), ("guided_regex", "regex"),
                      ("guided_choice", "choice"), ("guided_grammar", "grammar"),
                      ("json_schema", "json"), ("grammar", "grammar")):
        value = getattr(req, name)
        if value is not None:
            found.append((name, {key: value}))
    if req.structured_outputs is not None:
        so = dict(req.structured_outputs)
        for harmless in ("backend", "disable_fallback", "disable_additional_properties"):
            so.pop(harmless, None)
        if so.pop("whitespace_pattern", None) is not None:
            raise bad_request("structured_outputs.whitespace_pattern is not supported.",
                              "structured_outputs")
        found.append(("structured_outputs", so))
    if not found:
        return None, None
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise bad_request(f"Only one output constraint may be set, got {names}.", found[1][0])
    name, kw = found[0]
    try:
        return StructuredOutputsParams(**kw), name
    except (TypeError, ValueError) as exc:
        raise bad_request(f"{name}: {exc}", name) from None


def _tools(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    tools = []
    for i, tool in enumerate(req.tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not (
                isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': "
                              "{'name': ..., 'parameters': {...}}}.", f"tools[{i}]")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object.",
                              f"tools[{i}]")
        tools.append({"type": "function", "function": fn})
    return tools


def tool_plan(req: ChatCompletionRequest, default_parser: str | None
              ) -> tuple[ToolPlan, StructuredOutputsParams | None]:
    """The request's ``ToolPlan`` and, for required / named, the constraint enforcing it."""
    if req.function_call not in (None, "none") or (req.functions
                                                    and req.function_call is None):
        raise bad_request("functions / function_call (OpenAI's deprecated form) are not "
                          "supported: send tools and tool_choice (function_call 'none' gets "
                          "a plain reply).", "functions" if req.functions else "function_call")
    tools = _tools(req)
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    parallel = req.parallel_tool_calls is not False
    if choice in ("none", "auto"):
        if choice == "none" or not tools:
            return ToolPlan(), None
        return ToolPlan("auto", default_parser, None, parallel, tools), None
    if not tools:
        raise bad_request("tool_choice needs tools.", "tool_choice")
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if choice == "required":
        calls = [{"type": "object", "properties": {
            "name": {"const": name}, "parameters": _params_schema(fn)},
            "required": ["name", "parameters"], "additionalProperties": False}
            for name, fn in by_name.items()]
        schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        return (ToolPlan("required", None, None, parallel, tools),
                StructuredOutputsParams(json=schema))
    name = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}.", "tool_choice")
    if name not in by_name:
        raise bad_request(f"tool_choice names {name!r}, which is not in tools.", "tool_choice")
    return (ToolPlan("named", None, name, False, tools),
            StructuredOutputsParams(json=_params_schema(by_name[name])))


def _params_schema(fn: dict[str, Any]) -> dict[str, Any]:
    params = fn.get("parameters")
    return params if params else {"type": "object", "properties": {}}


def template_messages(messages: list[dict[str, Any]], template_has_tools: bool
                      ) -> list[dict[str, Any]]:
    """Tool-call history for the chat template: string arguments decoded to objects (what
    templates such as Qwen's ``tojson`` expect, as vLLM passes them); for a template without
    tool support, the calls written into the assistant's content so the model still sees
    them."""
    out = []
    for msg in messages:
        calls = msg.get("tool_calls")
        if calls:
            msg = dict(msg)
            decoded = []
            for call in calls:
                fn = dict(call.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
                decoded.append({**call, "function": fn})
            msg["tool_calls"] = decoded
            if not template_has_tools:
                text = "".join(
                    "<tool_call>" + json.dumps({"name": c["function"].get("name"),
                                                "arguments": c["function"].get("arguments")})
                    + "</tool_call>" for c in decoded)
                msg["content"] = (msg.get("content") or "") + text
        out.append(msg)
    return out
