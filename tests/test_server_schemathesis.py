"""Schemathesis against the real server, bounded in time: requests generated from the served
OpenAPI document (valid ones and invalid ones) must never get a 5xx, and every response must
match the document (status code, content type, headers, body schema).

The run is capped at ``BUDGET_S`` seconds in all; generated ``max_tokens``-like fields are
clamped (and set, where absent) to a few tokens so that each request costs little on a CPU
(the API surface is what is tested here, not long generations). Not checked: that every
schema-valid request is accepted, since limits that depend on the model (context length,
vocabulary size) cannot be stated in a static schema; those are 400s naming the field.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode, checks  # noqa: E402

BUDGET_S = 70.0  # the whole run, every operation and both modes
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_headers_conformance,
          checks.response_schema_conformance]
_CLAMPED = {"max_tokens": 3, "max_completion_tokens": 3, "min_tokens": 3, "n": 2}


def _clamp(body: object) -> None:
    """Keep generated requests cheap: a few tokens, at most two choices."""
    if not isinstance(body, dict):
        return
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = _CLAMPED["max_tokens"]  # else the context's room: minutes on CPU
    for key, cap in _CLAMPED.items():
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[key] = cap


def _fuzz(url: str, op, mode: GenerationMode, stop_at: float, ran: dict[str, int]) -> None:
    """Generated requests for one operation until ``stop_at`` (or 150 of them)."""
    label = f"{mode.value} {op.method.upper()} {op.path}"

    @settings(max_examples=150, deadline=None, database=None, print_blob=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if time.monotonic() > stop_at:
            return
        _clamp(case.body)
        case.call_and_validate(base_url=url, checks=CHECKS, timeout=60)
        ran[label] = ran.get(label, 0) + 1

    try:
        run()
    except Unsatisfiable:  # no invalid request exists (an operation without inputs)
        assert mode is GenerationMode.NEGATIVE, label


KNOWN_GOOD = [  # each kind of response the server gives, checked every run
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 2, "stream": True, "logprobs": True,
                              "top_logprobs": 2, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": ["Hi", "Yo"], "max_tokens": 2, "n": 2, "logprobs": 1,
                         "echo": True}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "prompt_logprobs": 1}),  # a 400
]


def test_generated_requests_get_no_5xx_and_conform_to_the_schema(live_server):
    schema = schemathesis.openapi.from_url(live_server.url + "/schema/openapi.json")
    for path, body in KNOWN_GOOD:
        case = schema[path]["POST"].Case(body=body, media_type="application/json")
        case.call_and_validate(base_url=live_server.url, checks=CHECKS, timeout=60)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions",
                                             "/v1/models", "/health"}
    deadline = time.monotonic() + BUDGET_S
    runs = [(m, op) for m in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            for op in operations]
    # the operations with a request body get most of the time: the rest have few inputs
    weights = [8 if op.method.upper() == "POST" else 1 for _, op in runs]
    ran: dict[str, int] = {}
    for i, (mode, op) in enumerate(runs):
        share = weights[i] / sum(weights[i:])  # of what is left of the budget
        _fuzz(live_server.url, op, mode,
              time.monotonic() + (deadline - time.monotonic()) * share, ran)
    print("requests per operation:", ran)
    assert time.monotonic() - deadline < 30  # one slow request may overrun a little
    for path in ("/v1/chat/completions", "/v1/completions"):
        for mode in ("positive", "negative"):
            assert ran.get(f"{mode} POST {path}", 0) >= 5, ran
