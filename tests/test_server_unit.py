"""HTTP-layer unit tests: the app over a fake engine, with Litestar's AsyncTestClient.

The fake implements AsyncEngine's API over the real SmolLM2 tokenizer: each choice replays a
random token script (fresh per test), so texts, deltas, logprobs and finish reasons are real
tokenizer output, without loading a model. End-to-end tests with the real engine are in
``test_server_e2e*.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from pathlib import Path

import httpx
import pytest
from litestar.testing import AsyncTestClient

from edge_llm.config import EngineConfig, SchedulerConfig, ServerConfig
from edge_llm.engine.tokenizer import apply_chat_template
from edge_llm.outputs import CompletionOutput, RequestOutput
from edge_llm.server import create_app
from edge_llm.server.terminal_chat import ThreadedServer

TOKENIZER_DIR = Path("/tmp/smol/hf")
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _tokenizer():
    from transformers import AutoTokenizer

    src = TOKENIZER_DIR
    if not (src / "tokenizer.json").is_file():
        from edge_llm.model.demo import ensure_demo_model

        src = ensure_demo_model()
    return AutoTokenizer.from_pretrained(str(src))


class FakeEngine:
    """AsyncEngine's API; choice i of a request replays ``script[i]`` (token ids)."""

    model_name = "fake-model"

    def __init__(self, tokenizer, scripts: list[list[int]], max_model_len: int = 256,
                 step_delay: float = 0.0, total_blocks: int = 64) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts
        self.max_model_len = max_model_len
        self.step_delay = step_delay
        self.total_blocks = total_blocks
        self.active: dict[str, int] = {}  # request id -> blocks held
        self.aborted: list[str] = []
        self.requests: list[tuple[list[int], object]] = []
        self.fail_at_step: int | None = None
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.active.pop(request_id, None)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return apply_chat_template(self.tokenizer, messages, add_generation_prompt)

    def stats(self) -> dict:
        used = sum(self.active.values())
        return dict(num_requests_running=len(self.active), num_requests_waiting=0,
                    num_requests_swapped=0, kv_cache_usage=used / self.total_blocks,
                    prefix_cache_queries=10, prefix_cache_hits=4, num_preemptions=0,
                    num_free_blocks=self.total_blocks - used, num_total_blocks=self.total_blocks)

    async def generate(self, prompt, params, request_id):
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.max_model_len} "
                             f"tokens, but the prompt has {len(prompt)} tokens.")
        if params.n > 8:  # as the real engine refuses n > max_num_seqs
            raise ValueError(f"n={params.n} exceeds max_num_seqs=8.")
        self.requests.append((list(prompt), params))
        self.active[request_id] = 1 + len(prompt) // 16
        outs = [CompletionOutput(i, "", [], logprobs=[] if params.logprobs is not None else None)
                for i in range(params.n)]
        try:
            for step in range(params.max_tokens):
                await asyncio.sleep(self.step_delay)
                if self.fail_at_step == step:
                    raise RuntimeError("simulated engine failure")
                for o in outs:
                    self._advance(o, params, step)
                yield RequestOutput(request_id, None, list(prompt),
                                    [_snapshot(o) for o in outs],
                                    all(o.finish_reason for o in outs))
                for o in outs:
                    o.text_delta, o.token_ids_delta, o.logprobs_delta = "", [], None
                if all(o.finish_reason for o in outs):
                    return
        finally:
            self.active.pop(request_id, None)

    def _advance(self, o: CompletionOutput, params, step: int) -> None:
        if o.finish_reason:
            return
        script = self.scripts[o.index % len(self.scripts)]
        tok = script[step % len(script)]
        o.token_ids.append(tok)
        o.token_ids_delta.append(tok)
        text = self.tokenizer.decode(o.token_ids)
        for stop in params.stop:
            if stop in text:
                text, o.finish_reason = text[: text.index(stop)], "stop"
        o.text_delta, o.text = text[len(o.text):], text
        if params.logprobs is not None:
            lps = {tok: -0.25}
            for k in range(params.logprobs):
                lps.setdefault((tok + 1 + k) % len(self.tokenizer), -1.0 - k)
            o.logprobs.append(lps)
            o.logprobs_delta = [lps]
        if not o.finish_reason and len(o.token_ids) >= params.max_tokens:
            o.finish_reason = "length"


def _snapshot(o: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(o.index, o.text, list(o.token_ids), None,
                            list(o.logprobs) if o.logprobs is not None else None,
                            o.finish_reason, None, o.text_delta, list(o.token_ids_delta),
                            o.logprobs_delta)


@pytest.fixture(scope="module")
def tokenizer():
    return _tokenizer()


@pytest.fixture
def scripts(tokenizer):
    rng = random.Random()
    words = ["alpha", "beta", "gamma", "delta", "Paris", "river", "blue", "seven", "quiet"]
    texts = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2)]
    return [tokenizer.encode(t) for t in texts]


def make_app(engine, *, max_num_seqs: int = 8, load_delay: float = 0.0, fail_load=None,
             **server_kw):
    def factory():
        import time

        time.sleep(load_delay)
        if fail_load is not None:
            raise fail_load
        return engine

    cfg = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
    server_kw.setdefault("log_requests", False)
    return create_app(cfg, ServerConfig(**server_kw), engine_factory=factory)


def sse_payloads(text: str) -> list:
    """Parse an SSE body strictly: every event is ``data: ...`` followed by a blank line."""
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def assert_error(r, status: int, param: str | None = "__any__") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param != "__any__":
        assert err["param"] == param, err
    return err


async def test_chat_non_streaming_shape_and_usage(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
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
    assert tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    for i, choice in enumerate(body["choices"]):
        assert choice["index"] == i and choice["finish_reason"] == "length"
        assert choice["message"] == {"role": "assistant",
                                     "content": tokenizer.decode(scripts[i][:5])}
        assert choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert body["usage"]["completion_tokens"] == 10
    assert body["usage"]["total_tokens"] == len(prompt_ids) + 10


async def test_chat_streaming_frames_role_deltas_finish_and_usage(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
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
    assert text == tokenizer.decode(scripts[0][:6])
    assert [ch["choices"][0]["finish_reason"] for ch in body] == [None] * 5 + ["length"]
    tokens = [lp for ch in body for lp in ch["choices"][0]["logprobs"]["content"]]
    assert len(tokens) == 6
    for tok_id, lp in zip(scripts[0], tokens, strict=False):
        assert lp["token"] == tokenizer.decode([tok_id]) and lp["logprob"] == -0.25
        assert bytes(lp["bytes"]).decode("utf-8", "replace") == lp["token"]
        assert len(lp["top_logprobs"]) == 2 and lp["top_logprobs"][0]["logprob"] == -0.25
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(ch.get("usage") is None for ch in chunks[:-1])


async def test_completions_batch_echo_logprobs_and_stop(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
    second = tokenizer.decode(scripts[0][3:4]).strip()
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
        gen = tokenizer.decode(scripts[ch["index"] % 2][:4])
        assert ch["text"] == prompt + gen
        lp = ch["logprobs"]
        n_prompt = len(tokenizer.encode(prompt))
        assert len(lp["tokens"]) == n_prompt + 4 and lp["token_logprobs"][0] is None
        assert lp["token_logprobs"][n_prompt:] == [-0.25] * 4
        assert lp["text_offset"][n_prompt] == len(prompt)
        assert all(t in top for t, top in zip(lp["tokens"][n_prompt:],
                                               lp["top_logprobs"][n_prompt:], strict=True))
    assert body["usage"]["completion_tokens"] == 16
    stopped = r2.json()["choices"][0]
    assert stopped["finish_reason"] == "stop" and second not in stopped["text"]
    assert engine.requests[-1][0] == [5, 6, 7]


async def test_completion_streaming_batch_indices(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
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
    assert texts == {0: tokenizer.decode(scripts[0][:3]), 1: tokenizer.decode(scripts[0][:3])}
    assert all(r[-1] == "length" and set(r[:-1]) <= {None} for r in reasons.values())
    assert chunks[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("body, status, param", [
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 7}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": 10**30}, 400, "seed"),
    ({"messages": [{"role": "user", "content": "x"}], "n": "two"}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}, 400,
     "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999": 1}}, 400,
     "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, 400, "top_logprobs"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ({"messages": "hello"}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model"),
])
async def test_chat_invalid_values_are_openai_errors(tokenizer, scripts, body, status, param):
    async with AsyncTestClient(make_app(FakeEngine(tokenizer, scripts))) as c:
        assert_error(await c.post("/v1/chat/completions", json=body), status, param)
        ok = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert ok.status_code == 200


@pytest.mark.parametrize("body, param", [
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": [-1, 2]}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "stop_token_ids": [10**8]}, "stop_token_ids"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x " * 300}, "prompt"),
])
async def test_completion_invalid_values(tokenizer, scripts, body, param):
    async with AsyncTestClient(make_app(FakeEngine(tokenizer, scripts))) as c:
        err = assert_error(await c.post("/v1/completions", json=body), 400, param)
    if body["prompt"] == "x " * 300:
        assert "256" in err["message"] and "301" in err["message"]


async def test_malformed_bodies_routes_and_size_are_openai_errors(tokenizer, scripts):
    app = make_app(FakeEngine(tokenizer, scripts), max_body_bytes=4096)
    raw = {"content-type": "application/json"}
    async with AsyncTestClient(app) as c:
        assert_error(await c.post("/v1/chat/completions", content=b"{bad json", headers=raw), 400)
        assert_error(await c.post("/v1/chat/completions", content=b"", headers=raw), 400)
        assert_error(await c.post("/v1/chat/completions", content=b"[1, 2]", headers=raw), 400)
        bad_utf8 = b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'
        assert_error(await c.post("/v1/chat/completions", content=bad_utf8, headers=raw), 400)
        deep = b'{"messages": ' + b"[" * 1900 + b"]" * 1900 + b"}"
        assert_error(await c.post("/v1/chat/completions", content=deep, headers=raw), 400)
        big = json.dumps({"prompt": "x" * 10000}).encode()
        assert_error(await c.post("/v1/completions", content=big, headers=raw), 413)
        assert_error(await c.get("/v1/nothing-here"), 404)
        err = assert_error(await c.get("/v1/chat/completions"), 405)
        assert "method" in err["message"].lower()
        assert_error(await c.delete("/health"), 405)
        assert (await c.get("/health")).status_code == 200


async def test_engine_failure_is_500_then_server_goes_on(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
    async with AsyncTestClient(make_app(engine)) as c:
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        engine.fail_at_step = 0
        err = assert_error(await c.post("/v1/chat/completions", json=body), 500)
        assert "simulated engine failure" in err["message"]
        stream = await c.post("/v1/chat/completions", json={**body, "stream": True})
        assert stream.status_code == 500  # failed before the first token: a real status
        engine.fail_at_step = 2  # after the first token: an error event, then [DONE]
        stream = await c.post("/v1/chat/completions", json={**body, "stream": True})
        assert stream.status_code == 200
        events = sse_payloads(stream.text)
        assert "simulated engine failure" in events[-1]["error"]["message"]
        engine.fail_at_step = None
        assert (await c.post("/v1/chat/completions", json=body)).status_code == 200


async def test_api_key_guards_v1_only(tokenizer, scripts):
    app = make_app(FakeEngine(tokenizer, scripts), api_key="s3cret-key")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with AsyncTestClient(app) as c:
        assert_error(await c.post("/v1/chat/completions", json=body), 401)
        assert_error(await c.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert_error(await c.post("/v1/completions", content=b"{bad"), 401)
        auth = {"Authorization": "Bearer s3cret-key"}
        assert (await c.post("/v1/chat/completions", json=body, headers=auth)).status_code == 200
        assert (await c.get("/v1/models", headers=auth)).json()["data"][0]["id"] == "fake-model"
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200


async def test_queue_full_is_429_with_retry_after_over_real_http(tokenizer, scripts):
    # AsyncTestClient runs requests one at a time: concurrency needs a real server
    engine = FakeEngine(tokenizer, scripts, step_delay=0.05)
    app = make_app(engine, max_num_seqs=2, max_queue=1)
    server = ThreadedServer(app)
    server.start()
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            results = await asyncio.gather(*[c.post("/v1/chat/completions", json=body)
                                             for _ in range(6)])
            assert sorted(r.status_code for r in results) == [200, 200, 200, 429, 429, 429]
            for r in results:
                if r.status_code == 429:
                    assert_error(r, 429)
                    assert int(r.headers["retry-after"]) >= 0
            assert (await c.post("/v1/chat/completions", json=body)).status_code == 200
    finally:
        server.stop()


async def test_disconnect_mid_stream_aborts_and_frees(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts, step_delay=0.05)
    app = make_app(engine)
    server = ThreadedServer(app)
    server.start()
    holder = app.state.ctx.holder
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            body = {"prompt": "count", "max_tokens": 200, "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        break  # leave after the first event
            for _ in range(100):
                if not engine.active and holder.in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            assert engine.active == {} and holder.in_flight == 0
            assert len(engine.aborted) == 1 and engine.aborted[0].startswith("cmpl-")
            r = await c.post("/v1/completions", json={"prompt": "again", "max_tokens": 2})
            assert r.status_code == 200
    finally:
        server.stop()


async def test_loading_health_503_and_requests_wait(tokenizer, scripts):
    app = make_app(FakeEngine(tokenizer, scripts), load_delay=0.6)
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with AsyncTestClient(app) as c:
        err = assert_error(await c.get("/health"), 503)
        assert "loading" in err["message"]
        r = await c.post("/v1/chat/completions", json=body)  # waits for the load
        assert r.status_code == 200
        assert (await c.get("/health")).json() == {"status": "ok"}


async def test_load_timeout_and_failure_are_503(tokenizer, scripts):
    slow = make_app(FakeEngine(tokenizer, scripts), load_delay=1.0, ready_timeout=0.1)
    async with AsyncTestClient(slow) as c:
        r = await c.get("/v1/models")
        assert_error(r, 503) and r.headers["retry-after"]
    broken = make_app(None, fail_load=OSError("no weights in /nowhere"))
    async with AsyncTestClient(broken) as c:
        await asyncio.sleep(0.2)
        assert "no weights" in assert_error(await c.get("/health"), 503)["message"]
        assert "no weights" in assert_error(await c.get("/v1/models"), 503)["message"]


async def test_metrics_names_labels_and_counts(tokenizer, scripts):
    engine = FakeEngine(tokenizer, scripts)
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
    assert lines[f"vllm:prompt_tokens_total{lab}"] == 2 * len(tokenizer.encode("hi"))
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


async def test_models_version_schema_and_page(tokenizer, scripts):
    async with AsyncTestClient(make_app(FakeEngine(tokenizer, scripts))) as c:
        models = (await c.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["object"] == "model"
        assert models["data"][0]["max_model_len"] == 256
        assert (await c.get("/version")).json()["version"]
        schema = (await c.get("/schema/openapi.json")).json()
        assert "/v1/chat/completions" in schema["paths"] and "/v1/completions" in schema["paths"]
        page = await c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/v1/chat/completions" in page.text and "<script" in page.text
        rid = await c.get("/health", headers={"X-Request-Id": "abc-123"})
        assert rid.headers["x-request-id"] == "abc-123"


async def test_chat_template_override(tokenizer, scripts, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}[assistant]{% endif %}")
    engine = FakeEngine(tokenizer, scripts)
    async with AsyncTestClient(make_app(engine, chat_template=str(template))) as c:
        r = await c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2})
        assert r.status_code == 200
    assert tokenizer.decode(engine.requests[0][0]) == "[user]Hello there\n[assistant]"


async def test_chat_stream_n2_role_chunks_and_one_finish_per_choice(tokenizer, scripts):
    async with AsyncTestClient(make_app(FakeEngine(tokenizer, scripts))) as c:
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
            tokenizer.decode(scripts[i][:4])
        assert [ch["finish_reason"] for ch in mine if ch["finish_reason"]] == ["length"]


async def test_one_log_line_per_request(tokenizer, scripts, caplog):
    app = make_app(FakeEngine(tokenizer, scripts), log_requests=True)
    with caplog.at_level("INFO", logger="edge_llm.server"):
        async with AsyncTestClient(app) as c:
            await c.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 3},
                         headers={"X-Request-Id": "req-42"})
            await c.get("/v1/missing")
    lines = [r.getMessage() for r in caplog.records if r.name == "edge_llm.server"
             and r.getMessage().startswith(("POST", "GET"))]
    n_prompt = len(tokenizer.encode("hello there"))
    assert re.fullmatch(rf"POST /v1/completions 200 id=req-42 prompt_tokens={n_prompt} "
                        r"completion_tokens=3 \d+\.\d{3}s", lines[0]), lines
    assert re.fullmatch(r"GET /v1/missing 404 id=\w+ prompt_tokens=0 completion_tokens=0 "
                        r"\d+\.\d{3}s", lines[1]), lines
    assert len(lines) == 2
