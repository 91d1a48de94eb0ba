"""The served OpenAPI document says what the server accepts: the sampling ranges it states are
the ones ``SamplingParams`` enforces, always-refused fields accept only their "off" value,
and every error status is documented as the OpenAI error object (no model: fast)."""

from __future__ import annotations

import jsonschema
import pytest
from litestar.testing import TestClient

from edge_llm.config import ServerConfig
from edge_llm.sampling_params import SamplingParams
from edge_llm.server import create_app
from edge_llm.server.openapi import SAMPLING_RANGES


@pytest.fixture(scope="module")
def doc() -> dict:
    app = create_app(None, ServerConfig(allowed_hosts=("testserver.local",), log_requests=False),
                     engine_factory=lambda: None)
    with TestClient(app) as c:
        served = c.get("/schema/openapi.json").json()
        assert c.get("/schema/openapi.json").json() == served  # corrected once, not twice
        assert "prompt_logprobs" in c.get("/schema/openapi.yaml").text
    return served


def _accepts(doc: dict, request: str, field: str, value: object) -> bool:
    schema = doc["components"]["schemas"][request]["properties"][field]
    resolver_doc = {**schema, "components": doc["components"]}
    try:
        jsonschema.validate(value, resolver_doc)
    except jsonschema.ValidationError:
        return False
    return True


def _sampling_accepts(field: str, value: object) -> bool:
    try:
        SamplingParams(**{field: value})
    except (ValueError, TypeError):
        return False
    return True


BOUNDARIES = {  # values at and just past each stated bound
    "n": [1, 128, 0, 129],
    "temperature": [0.0, 100.0, -0.01, 100.01],
    "top_p": [1e-9, 1.0, 0.0, 1.01],
    "top_k": [-1, 0, 5, -2],
    "min_p": [0.0, 1.0, -0.01, 1.01],
    "presence_penalty": [-2.0, 2.0, -2.01, 2.01],
    "frequency_penalty": [-2.0, 2.0, -2.01, 2.01],
    "repetition_penalty": [1e-6, 3.0, 0.0, -1.0],
    "stop_token_ids": [[0, 7], [], [-1]],
    "allowed_token_ids": [[0], [3, 4], [], [-1]],
    "truncate_prompt_tokens": [-1, 1, 0, -2],
    "logit_bias": [{"5": 100.0}, {"5": -100.0}, {"5": 100.5}, {"x": 1.0}],
}


@pytest.mark.parametrize("request_name", ["ChatCompletionRequest", "CompletionRequest"])
@pytest.mark.parametrize("field", sorted(BOUNDARIES))
def test_stated_sampling_ranges_are_the_enforced_ones(doc, request_name, field):
    assert field in SAMPLING_RANGES
    for value in BOUNDARIES[field]:
        sampled = value
        if field == "logit_bias":  # the server turns keys into ints (a bad key is a 400)
            try:
                sampled = {int(k): v for k, v in value.items()}
            except ValueError:
                sampled = None
        enforced = sampled is not None and _sampling_accepts(field, sampled)
        assert _accepts(doc, request_name, field, value) is enforced, (field, value)
    assert _accepts(doc, request_name, field, None)  # null: the default


@pytest.mark.parametrize("request_name,field,off,refused", [
    ("ChatCompletionRequest", "prompt_logprobs", None, 1),
    ("CompletionRequest", "prompt_logprobs", None, 0),
    ("ChatCompletionRequest", "echo", False, True),
    ("ChatCompletionRequest", "chat_template", None, "{{ messages }}"),
    ("CompletionRequest", "suffix", "", "and then"),
    ("ChatCompletionRequest", "max_tokens", 1, 0),
    ("ChatCompletionRequest", "top_logprobs", 20, 21),
    ("CompletionRequest", "logprobs", 20, 21),
    ("ChatCompletionRequest", "messages", [{"role": "user", "content": "x"}], []),
])
def test_refused_values_are_not_advertised(doc, request_name, field, off, refused):
    assert _accepts(doc, request_name, field, off)
    assert not _accepts(doc, request_name, field, refused)


def test_messages_roles_and_content_parts(doc):
    schemas = doc["components"]["schemas"]
    assert set(schemas["ChatMessage"]["properties"]["role"]["enum"]) >= {"system", "user",
                                                                       "assistant"}
    part = schemas["ContentPart"]
    jsonschema.validate({"type": "text", "text": "hi"}, part)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"type": "image_url", "image_url": {"url": "x"}}, part)


def test_every_error_is_documented_as_the_openai_error_object(doc):
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            responses = op["responses"]
            assert "default" in responses and "403" in responses, (path, method)
            if method == "post":
                assert {"408", "415"} <= set(responses), path
            for code, response in responses.items():
                if code == "default" or code[0] in "45":
                    assert response["content"] == {"application/json": {"schema": ref}}
    for path in ("/v1/chat/completions", "/v1/completions"):
        content = doc["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}
