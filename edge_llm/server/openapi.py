"""The served OpenAPI document, made to say what the server really accepts and answers.

Litestar derives the document from the msgspec structs, which are deliberately wider than what
is served: they read OpenAI fields this server refuses (to refuse them by name rather than
ignore them), and value ranges are checked by ``SamplingParams`` and ``preprocess`` for their
error messages. Generated as is, the document would advertise those fields and ranges as
accepted. ``describe_truthfully`` corrects it in place, once, when it is first served:

- request fields that are always refused accept only their "off" value (``prompt_logprobs``,
  the chat ``echo`` and ``chat_template``, ``suffix``, other servers' generation fields in
  ``protocol.REFUSED_FIELDS``); content parts are text parts;
- sampling ranges are those ``SamplingParams`` enforces (``SAMPLING_RANGES``, kept equal to
  it by tests/test_openapi_truth.py);
- streaming responses are documented as ``text/event-stream``; every operation documents its
  errors as the OpenAI error object (the guard's 403/408/415 included, ``default`` for the
  rest), which is what every non-2xx body is.

Limits that depend on the model (context length, vocabulary) or on another field (``best_of``
equal to ``n``) cannot be stated in the schema; they are 400s naming the field. Tools and the
structured-output fields are left as the structs say.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import OpenAPIRenderPlugin

from .preprocess import ROLES
from .protocol import REFUSED_FIELDS

Schema = dict[str, Any]
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
_NULL = {"type": "null"}

# field -> (JSON schema of an accepted non-null value); the same in both request bodies
SAMPLING_RANGES: dict[str, Schema] = {
    "n": {"type": "integer", "minimum": 1, "maximum": 128},
    "temperature": {"type": "number", "minimum": 0, "maximum": 100},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 2**63 - 1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "logit_bias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                   "additionalProperties": {"type": "number", "minimum": -100,
                                            "maximum": 100}},
    "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                  "maximum": 2**63 - 1}},
    "allowed_token_ids": {"type": "array", "minItems": 1,
                          "items": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}},
    "truncate_prompt_tokens": {"type": "integer", "minimum": -1, "maximum": 2**63 - 1,
                               "not": {"const": 0}},
    # vLLM's prompt logprobs are not served (the completions endpoint's echo gives them)
    "prompt_logprobs": {"not": {}},
}
# other servers' generation fields, read only to refuse them by name
_REFUSED: dict[str, Schema] = {name: {"not": {}} for name in REFUSED_FIELDS}
_CHAT_FIELDS: dict[str, Schema] = {
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "echo": {"type": "boolean", "const": False},
    "chat_template": {"not": {}},  # the server's --chat-template only
    "messages": {"type": "array", "minItems": 1,
                 "items": {"$ref": "#/components/schemas/ChatMessage"}},
}
_COMPLETION_FIELDS: dict[str, Schema] = {
    "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    "suffix": {"type": "string", "maxLength": 0},
}
_CONTENT_PART: Schema = {
    "type": "object", "title": "ContentPart", "required": ["type", "text"],
    "properties": {"type": {"type": "string", "const": "text"}, "text": {"type": "string"}},
}
_GUARD_ERRORS = {
    "403": "Host or Origin not allowed (cross-site and DNS-rebinding defences)",
    "408": "The request body did not arrive in time",
    "415": "The body is not JSON (Content-Type: application/json)",
}
# one server-sent event of a stream (``stream: true``): a chunk as JSON, an error object
# ({"error": ...}) after a failure, and ``[DONE]`` last
_SSE_EVENT: Schema = {
    "type": "object", "required": ["data"],
    "properties": {"data": {"anyOf": [{"const": "[DONE]"},
                                      {"type": "string", "contentMediaType": "application/json"}]},
                   "event": {"type": "string"}},
    "description": "One event: 'data: {chunk}', an OpenAI error object after a failure, then "
                   "'data: [DONE]'",
}
_STREAMED = ("/v1/chat/completions", "/v1/completions", "/invocations")


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, _NULL]}


def describe_truthfully(doc: Schema) -> None:
    """Correct Litestar's generated document ``doc`` (a dict) in place; see the module doc."""
    schemas = doc.get("components", {}).get("schemas", {})
    for name, extra in (("ChatCompletionRequest", _CHAT_FIELDS),
                        ("CompletionRequest", _COMPLETION_FIELDS)):
        props = schemas.get(name, {}).get("properties", {})
        for field, schema in {**SAMPLING_RANGES, **_REFUSED, **extra}.items():
            if field in props:
                required = field in schemas[name].get("required", ())
                props[field] = schema if required else _nullable(schema)
    if "ContentPart" in schemas:
        schemas["ContentPart"] = _CONTENT_PART
    role = schemas.get("ChatMessage", {}).get("properties", {}).get("role")
    if role is not None:
        role["enum"] = list(ROLES)
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if isinstance(op, dict) and "responses" in op:
                _document_errors(op["responses"], method)
                if path in _STREAMED and "200" in op["responses"]:
                    op["responses"]["200"].setdefault("content", {})["text/event-stream"] = {
                        "schema": _SSE_EVENT}


def _document_errors(responses: Schema, method: str) -> None:
    codes = dict(_GUARD_ERRORS) if method != "get" else {"403": _GUARD_ERRORS["403"]}
    for code, what in codes.items():
        responses.setdefault(code, {"description": what})
    responses.setdefault("default", {"description": "Any other error"})
    for code, response in responses.items():
        if code == "default" or code[0] in "45":
            response["content"] = {"application/json": {"schema": _ERROR_REF}}


def render_plugins() -> list[OpenAPIRenderPlugin]:
    """Litestar's default renderers (JSON, YAML and the browsable pages under /schema), each
    rendering the corrected document. The document is generated on first use (it takes
    most of a second, which a cold start should not pay) and corrected then, once: Litestar
    caches the dict it hands every renderer."""
    corrected: list[int] = []  # id of the document once corrected
    plugins = list(OpenAPIConfig(title="", version="").render_plugins)
    for plugin in plugins:
        render = plugin.render

        def render_corrected(request: Request, doc: Schema, render: Any = render) -> bytes:
            if id(doc) not in corrected:
                describe_truthfully(doc)
                corrected.append(id(doc))
            return render(request, doc)

        plugin.render = render_corrected  # type: ignore[method-assign]
    return plugins
