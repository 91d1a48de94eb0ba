"""HTTP-layer unit tests: response shapes, streaming framing, logprobs, metrics, the page, over
a fake engine (``test_server_fake_engine.py``) with Litestar's AsyncTestClient. End-to-end
tests with the real engine are in ``test_server_e2e*.py``."""

from __future__ import annotations

import re

import pytest
from litestar.testing import AsyncTestClient

from tests.test_server_fake_engine import FakeEngine, assert_error, make_app, sse_payloads

pytestmark = pytest.mark.anyio


async def test_chat_non_streaming_shape_and_usage(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/chat/completions", json={
            "model": "fake-model", "max_tokens": 5, "n": 2, "temperature": 0,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
        assert r.status_code == 200, r.text
        body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "fake-model" and isinstance(body["created"], int)
    assert "system_fingerprint" in body
    prompt_ids, params = engine.requests[0]
    assert params.n == 2 and params.max_tokens == 5 and params.temperature == 0
    assert fake_tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    for i, choice in enumerate(body["choices"]):
        assert choice["index"] == i and choice["finish_reason"] == "length"
        assert choice["message"] == {"role": "assistant",
                                     "content": fake_tokenizer.decode(token_scripts[i][:5])}
        assert choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert body["usage"]["completion_tokens"] == 10
    assert body["usage"]["total_tokens"] == len(prompt_ids) + 10


async def test_chat_streaming_frames_role_deltas_finish_and_usage(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_payloads(r.text)
    assert {ch["id"] for ch in chunks} == {chunks[0]["id"]}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = chunks[1:-1]
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in body)
    assert text == fake_tokenizer.decode(token_scripts[0][:6])
    assert [ch["choices"][0]["finish_reason"] for ch in body] == [None] * 5 + ["length"]
    tokens = [lp for ch in body for lp in ch["choices"][0]["logprobs"]["content"]]
    assert len(tokens) == 6
    for tok_id, lp in zip(token_scripts[0], tokens, strict=False):
        assert lp["token"] == fake_tokenizer.decode([tok_id]) and lp["logprob"] == -0.25
        assert bytes(lp["bytes"]).decode("utf-8", "replace") == lp["token"]
        assert len(lp["top_logprobs"]) == 2 and lp["top_logprobs"][0]["logprob"] == -0.25
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(ch.get("usage") is None for ch in chunks[:-1])


async def test_completions_batch_echo_logprobs_and_stop(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    second = fake_tokenizer.decode(token_scripts[0][3:4]).strip()
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/completions", json={
            "prompt": ["One two", "Three"], "n": 2, "max_tokens": 4, "echo": True,
            "logprobs": 1})
        assert r.status_code == 200, r.text
        body = r.json()
        r2 = await c.post("/v1/completions", json={"prompt": [[5, 6, 7]], "max_tokens": 8,
                                                    "stop": [second]})
        assert r2.status_code == 200, r2.text
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2, 3]
    for ch in body["choices"]:
        prompt = ["One two", "Three"][ch["index"] // 2]
        gen = fake_tokenizer.decode(token_scripts[ch["index"] % 2][:4])
        assert ch["text"] == prompt + gen
        lp = ch["logprobs"]
        n_prompt = len(fake_tokenizer.encode(prompt))
        assert len(lp["tokens"]) == n_prompt + 4 and lp["token_logprobs"][0] is None
        assert lp["token_logprobs"][n_prompt:] == [-0.25] * 4
        assert lp["text_offset"][n_prompt] == len(prompt)
        assert all(t in top for t, top in zip(lp["tokens"][n_prompt:],
                                               lp["top_logprobs"][n_prompt:], strict=True))
    assert body["usage"]["completion_tokens"] == 16
    stopped = r2.json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and second not in stopped["text"]
    assert engine.requests[-1][0] == [5, 6, 7]


async def test_completion_streaming_batch_indices(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine)) as c:
        r = await c.post("/v1/completions", json={
            "prompt": ["a b", "c d"], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}})
        chunks = sse_payloads(r.text)
    texts: dict[int, str] = {}
    reasons: dict[int, list] = {}
    for ch in chunks[:-1]:
        (choice,) = ch["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        reasons.setdefault(choice["index"], []).append(choice["finish_reason"])
    first = fake_tokenizer.decode(token_scripts[0][:3])
    assert texts == {0: first, 1: first}
    assert all(r[-1] == "length" and set(r[:-1]) <= {None} for r in reasons.values())
    assert chunks[-1]["usage"]["completion_tokens"] == 6


async def test_metrics_names_labels_and_counts(fake_tokenizer, token_scripts):
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine, served_model_name="my-model")) as c:
        for _ in range(2):
            r = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3,
                                                       "model": "my-model"})
            assert r.status_code == 200 and r.json()["model"] == "my-model"
        text = (await c.get("/metrics")).text
    lines = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in text.splitlines()
             if ln and not ln.startswith("#")}
    lab = '{model_name="my-model"}'
    assert lines[f"vllm:generation_tokens_total{lab}"] == 6
    assert lines[f"vllm:prompt_tokens_total{lab}"] == 2 * len(fake_tokenizer.encode("hi"))
    assert lines['vllm:request_success_total{finished_reason="length",model_name="my-model"}'] == 2
    assert lines[f"vllm:e2e_request_latency_seconds_count{lab}"] == 2
    assert lines[f"vllm:time_to_first_token_seconds_count{lab}"] == 2
    assert lines[f"vllm:inter_token_latency_seconds_count{lab}"] == 4
    assert lines[f"vllm:prefix_cache_queries_total{lab}"] == 10
    assert lines[f"vllm:prefix_cache_hits_total{lab}"] == 4
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total"):
        assert f"{name}{lab}" in lines


async def test_models_version_schema_and_page(fake_tokenizer, token_scripts):
    async with AsyncTestClient(make_app(FakeEngine(fake_tokenizer, token_scripts))) as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["object"] == "model"
        assert models["data"][0]["max_model_len"] == 256
        one = (await c.get("/v1/models/fake-model")).json()
        assert one == models["data"][0]
        assert_error(await c.get("/v1/models/gpt-9"), 404, "model")
        assert_error(await c.get("/v1/models/org/gpt-9"), 404, "model")
        assert (await c.get("/version")).json()["version"]
        schema = (await c.get("/schema/openapi.json")).json()
        assert "/v1/chat/completions" in schema["paths"] and "/v1/completions" in schema["paths"]
        page = await c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/v1/chat/completions" in page.text and "<script" in page.text
        rid = await c.get("/health", headers={"X-Request-Id": "abc-123"})
        assert rid.headers["x-request-id"] == "abc-123"


async def test_chat_template_override(fake_tokenizer, token_scripts, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% endif %}")
    engine = FakeEngine(fake_tokenizer, token_scripts)
    async with AsyncTestClient(make_app(engine, chat_template=str(template))) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2})
        assert r.status_code == 200
    assert fake_tokenizer.decode(engine.requests[0][0]) == "[user]Hello there\n[assistant]"


async def test_chat_stream_n2_role_chunks_and_one_finish_per_choice(fake_tokenizer, token_scripts):
    async with AsyncTestClient(make_app(FakeEngine(fake_tokenizer, token_scripts))) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2,
            "stream": True})
        chunks = sse_payloads(r.text)
    roles = [ch["choices"][0]["index"] for ch in chunks
             if ch["choices"][0]["delta"].get("role") == "assistant"]
    assert roles == [0, 1]
    for i in (0, 1):
        mine = [ch["choices"][0] for ch in chunks if ch["choices"][0]["index"] == i]
        assert "".join(ch["delta"].get("content", "") for ch in mine) == \
            fake_tokenizer.decode(token_scripts[i][:4])
        assert [ch["finish_reason"] for ch in mine if ch["finish_reason"]] == ["length"]


async def test_one_log_line_per_request(fake_tokenizer, token_scripts, caplog):
    app = make_app(FakeEngine(fake_tokenizer, token_scripts), log_requests=True)
    with caplog.at_level("INFO", logger="edge_llm.server"):
        async with AsyncTestClient(app) as c:
            await c.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 3},
                         headers={"X-Request-Id": "req-42"})
            await c.get("/v1/missing")
    lines = [r.getMessage() for r in caplog.records if r.name == "edge_llm.server"
             and r.getMessage().startswith(("POST", "GET"))]
    n_prompt = len(fake_tokenizer.encode("hello there"))
    assert re.fullmatch(rf"POST /v1/completions 200 id=req-42 prompt_tokens={n_prompt} "
                        r"completion_tokens=3 \d+\.\d{3}s", lines[0]), lines
    assert re.fullmatch(r"GET /v1/missing 404 id=\w+ prompt_tokens=0 completion_tokens=0 "
                        r"\d+\.\d{3}s", lines[1]), lines
    assert len(lines) == 2
