"""End-to-end error handling on the real server: every bad request is a 4xx OpenAI error object,
never a 500 or a crash, and the server answers normally afterwards."""

from __future__ import annotations

import json
import random
import re

import httpx
import pytest

CHAT = "/v1/chat/completions"
OK_BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def http(live_server):
    with httpx.Client(base_url=live_server.url, timeout=60) as c:
        yield c


def check_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


def _junk(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))


BAD_BODIES = [
    (CHAT, b"{not json"),
    (CHAT, b""),
    (CHAT, b"null"),
    (CHAT, b'"a string"'),
    (CHAT, b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'),
    (CHAT, json.dumps({"messages": []}).encode()),
    (CHAT, json.dumps({"messages": [{"role": "user"}]}).encode()),
    (CHAT, json.dumps({"messages": [{"content": "no role"}]}).encode()),
    (CHAT, json.dumps({**OK_BODY, "max_tokens": "many"}).encode()),
    (CHAT, json.dumps({**OK_BODY, "max_tokens": -5}).encode()),
    (CHAT, json.dumps({**OK_BODY, "max_tokens": 10**40}).encode()),
    (CHAT, json.dumps({**OK_BODY, "temperature": 1e300}).encode()),
    (CHAT, json.dumps({**OK_BODY, "n": 10**6}).encode()),
    (CHAT, json.dumps({**OK_BODY, "top_k": -7}).encode()),
    (CHAT, json.dumps({**OK_BODY, "stop": [""]}).encode()),
    (CHAT, json.dumps({**OK_BODY, "stop": 5}).encode()),
    (CHAT, json.dumps({**OK_BODY, "logit_bias": {"1": 500}}).encode()),
    (CHAT, json.dumps({**OK_BODY, "seed": -(10**25)}).encode()),
    (CHAT, json.dumps({**OK_BODY, "stream": "yes"}).encode()),
    ("/v1/completions", json.dumps({"prompt": [[1, 2], "x"]}).encode()),
    ("/v1/completions", json.dumps({"prompt": [49152]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "hi", "logprobs": 99}).encode()),
    ("/v1/completions", json.dumps({"max_tokens": 3}).encode()),
    ("/v1/completions", b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}"),
]


@pytest.mark.parametrize("path, body", BAD_BODIES, ids=[f"{p[4:]}-{i}" for i, (p, _) in
                                                        enumerate(BAD_BODIES)])
def test_bad_bodies_are_400(http, path, body):
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    err = check_error(r, 400)
    assert err["type"] == "invalid_request_error"


def test_random_bytes_never_500(http, rng):
    for _ in range(20):
        r = http.post(CHAT, content=_junk(rng), headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, r.text
        check_error(r, r.status_code)
    assert http.post(CHAT, json=OK_BODY).status_code == 200


def test_context_too_long_names_both_lengths(http):
    long_prompt = "hello " * 1500  # ~1500 tokens > --max-model-len 1024
    pattern = r"maximum context length is (\d+) tokens, but the prompt has (\d+) tokens"
    for path, body in (("/v1/completions", {"prompt": long_prompt}),
                       (CHAT, {"messages": [{"role": "user", "content": long_prompt}]})):
        m = re.search(pattern, check_error(http.post(path, json=body), 400)["message"])
        assert m and int(m[1]) == 1024 and int(m[2]) >= 1500
    err = check_error(http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5000}),
                      400)
    m = re.search(r"length is 1024 tokens.*requested (\d+) tokens \((\d+) in the prompt, "
                  r"5000 in the completion\)", err["message"])
    assert m and int(m[1]) == int(m[2]) + 5000 and err["param"] == "max_tokens"


def test_unknown_model_route_method_and_size(http):
    err = check_error(http.post(CHAT, json={**OK_BODY, "model": "no-such-model"}), 404)
    assert "no-such-model" in err["message"] and err["code"] == "model_not_found"
    check_error(http.get("/v1/engines"), 404)
    check_error(http.put("/v1/models"), 405)
    huge = json.dumps({"prompt": "x" * (17 * 1024 * 1024)}).encode()
    r = http.post("/v1/completions", content=huge, headers={"content-type": "application/json"})
    check_error(r, 413)
    assert http.post(CHAT, json=OK_BODY).status_code == 200
    assert http.get("/health").status_code == 200


def test_metrics_and_version(http):
    text = http.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_success_total"):
        assert f"{name}{{" in text, name
    assert 'model_name="SmolLM2-135M-Instruct-AWQ"' in text
    info = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    assert 'cache_dtype="auto"' in info and 'block_size="16"' in info and info.endswith(" 1.0")
    # forwards by path: the CPU server runs every step eagerly (no CUDA graphs), and it has
    # served requests by now (this module's earlier tests, the warm-up)
    steps = {ln.split('path="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1])
             for ln in text.splitlines() if ln.startswith("edge_llm:forward_steps_total{")}
    assert set(steps) == {"decode_graph", "short_graph", "eager"}, steps
    assert steps["eager"] > 0 and steps["decode_graph"] == steps["short_graph"] == 0
    assert http.get("/version").json()["version"]
    assert "/v1/chat/completions" in http.get("/schema/openapi.json").json()["paths"]
