"""Chat templates rendered the way transformers renders them, without importing transformers.

Mirrors ``transformers.utils.chat_template_utils`` (read at 5.17 and 5.24): a jinja2
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension and a ``{% generation %}`` tag that renders its body, a ``tojson`` filter that does not
escape HTML (``json.dumps`` with ``ensure_ascii=False``), ``raise_exception``, ``strftime_now``,
and the 5.24 sandbox hardening (``dict`` and ``namespace`` that refuse underscore names).
Messages are copied into plain JSON data first; keys whose value is None are dropped and the
reasoning aliases are filled in (5.24), which changes nothing for plain string messages.

Not supported (a clear error instead): tools given as Python callables (pass JSON schemas) and
assistant-token masks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

# Names a message's reasoning is passed under; templates read the first (transformers 5.24).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """The compiled ``jinja2.Template`` of ``source`` (cached: servers render one template)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body (transformers uses the tag
        to mark assistant tokens; only the text matters here)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        """``dict`` for templates without the type's attributes (no escape through them)."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                f"got {name!r}. Please rename the attribute.")

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's own signature
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(source)


def plain_data(value: Any) -> Any:
    """``value`` rebuilt from JSON types; anything else becomes ``"<TypeName>"`` (the sandbox
    must not see objects with methods of their own)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if any(c.__name__ == "generic" and c.__module__ == "numpy" for c in type(value).__mro__):
        return plain_data(value.item())  # a numpy scalar: np.bool_(False) must stay falsy
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(conversation: Any) -> list[dict]:
    """Plain message dicts: None-valued keys dropped, reasoning aliases filled in."""
    raw = getattr(conversation, "messages", conversation)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError("Cannot apply a chat template to an empty conversation: provide at least "
                         "one message.")
    out = []
    for message in raw:
        if callable(getattr(message, "model_dump", None)):
            message = message.model_dump()
        elif dataclasses.is_dataclass(message) and not isinstance(message, type):
            message = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
        if not isinstance(message, Mapping):
            raise TypeError(f"Chat messages should be dicts, got {message!r}.")
        message = plain_data({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _mark_final_message(chat: list[dict], field: str, source: str) -> str:
    """Append the continue tag to the last message's ``field``; returns the text continued."""
    final = chat[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}" '
                         "to continue!")
    fields = [field]
    if field in _REASONING_FIELDS:  # reasoning is copied under several names: tag each copy
        fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in source for f in fields):
        raise ValueError(f'continue_final_message is set to "{field}" but this is not an '
                         "accepted field in the chat_template")
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise ValueError("continue_final_message is set but we could not find any text to "
                         "continue in the final message!")
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def render_chat(
    source: str,
    conversation: Any,
    *,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """``conversation`` (a list of message dicts) rendered with the template ``source``.

    ``variables`` reach the template beside ``messages``, ``tools``, ``documents`` and
    ``add_generation_prompt`` (the tokenizer passes its special tokens and the caller's extra
    keyword arguments). ``continue_final_message`` (True: the "content" field, or a field name)
    cuts the text after the last message's text so the model continues it. Template errors
    (``raise_exception``) come out as ``jinja2.TemplateError``.
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise ValueError("Tools must be JSON schemas (dicts); Python callables are not "
                                 "converted here.")
    if documents is not None:
        for document in documents:
            if not isinstance(document, Mapping):
                raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    chat = _messages(conversation)
    template = compile_template(source)
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = _mark_final_message(chat, field, source)
    text = template.render(
        messages=chat, tools=plain_data(tools), documents=plain_data(documents),
        add_generation_prompt=add_generation_prompt, **plain_data(dict(variables or {})))
    if final is None:
        return text
    if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
        raise ValueError("continue_final_message is set but the final message does not appear in "
                         "the chat after applying the chat template.")
    cut = text.rindex(_CONTINUE_TAG.strip())
    if text[cut: cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:cut]
    return text[:cut].rstrip()  # the template trimmed the message's trailing space
