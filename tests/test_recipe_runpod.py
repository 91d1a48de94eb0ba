"""The RunPod recipe through RunPod's own SDK (``runpod``): the real handler in the SDK's local
test mode and behind its local API server, jobs served concurrently (a backend that answers
only once two requests are in flight at the same time proves it), the JobScaler's concurrency
from the recipe's ``concurrency_modifier``, and the worker image's Dockerfile."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.conftest import free_port
from tests.recipe_fixtures import (  # noqa: F401 - fixture
    DEFAULT_MAX_REPLICAS,
    RECIPES,
    REPLICA_CONCURRENCY,
    ROOT,
    SCALE_TARGET,
    image_env,
    load,
    resolved,
    served,
)

pytest.importorskip("runpod", reason="the RunPod SDK is in the test extra: pip install runpod")
HANDLER = RECIPES / "runpod" / "handler.py"


def collect(handler, job: dict) -> list[dict]:
    async def run() -> list[dict]:
        return [chunk async for chunk in handler.handler(job)]
    return asyncio.run(run())


def test_handler_streams_openai_chunks(served, monkeypatch, fake_tokenizer):  # noqa: F811
    url, _, scripts = served
    monkeypatch.setenv("EDGE_LLM_URL", url)
    handler = load("runpod/handler.py")
    n = random.randint(2, 6)
    chunks = collect(handler, {"id": "job-1", "input": {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "stream": True}})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == fake_tokenizer.decode(scripts[0][:n])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    (whole,) = collect(handler, {"id": "job-2", "input": {"prompt": "Hi", "max_tokens": n}})
    assert whole["object"] == "text_completion"
    assert whole["usage"]["completion_tokens"] == n
    (err,) = collect(handler, {"id": "job-3", "input": {"max_tokens": 2}})
    assert "messages" in err["error"]
    (err,) = collect(handler, {"id": "job-4", "input": {"prompt": "Hi", "max_tokens": 0}})
    assert err["error"]["param"] == "max_tokens"


def worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EDGE_LLM_", "RUNPOD_"))}
    return env | {"EDGE_LLM_URL": url, "PYTHONPATH": str(ROOT)}


class LocalApi:
    """``python handler.py --rp_serve_api``: RunPod's local API server (/run, /runsync,
    /stream) around the real handler, against the backend at ``url``. (The SDK's other local
    mode, ``--test_input``, does not iterate generator handlers in runpod 1.12: it reports the
    generator object as the output and passes.)"""

    def __init__(self, url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, str(HANDLER), "--rp_serve_api", "--rp_api_port", str(self.port)],
            env=worker_env(url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.proc.stdout.read().decode()[-3000:]
            try:
                httpx.get(self.url + "/docs", timeout=2)
                return
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "RunPod's local API server did not start"
                time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def test_sdk_local_api_server_runs_the_real_handler(served, fake_tokenizer):  # noqa: F811
    url, _, scripts = served
    api = LocalApi(url)
    try:
        n = random.randint(2, 5)
        job = {"input": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": n,
                         "stream": True}}
        answer = httpx.post(api.url + "/runsync", json=job, timeout=60).json()
        assert answer["status"] == "COMPLETED", answer
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in answer["output"])
        assert text == fake_tokenizer.decode(scripts[0][:n])
        job["input"]["stream"] = False
        answer = httpx.post(api.url + "/runsync", json=job, timeout=60).json()
        (whole,) = answer["output"]
        assert whole["choices"][0]["message"]["content"] == fake_tokenizer.decode(scripts[0][:n])
    finally:
        api.stop()


class Barrier(BaseHTTPRequestHandler):
    """An OpenAI backend that answers a completion only while another one is in flight: a
    worker that serves jobs one at a time gets 504s."""

    barrier = threading.Barrier(2)

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # /health
        self._send(200, {"ok": True})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        try:
            self.barrier.wait(timeout=20)
        except threading.BrokenBarrierError:
            self._send(504, {"error": {"message": "served alone", "type": "timeout"}})
            return
        self._send(200, {"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "together"},
             "finish_reason": "stop"}]})

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_sdk_local_api_server_serves_jobs_concurrently():
    backend = ThreadingHTTPServer(("127.0.0.1", 0), Barrier)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    api = LocalApi(f"http://127.0.0.1:{backend.server_port}")
    try:
        job = {"input": {"messages": [{"role": "user", "content": "Hi"}]}}
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: httpx.post(
                api.url + "/runsync", json=job, timeout=60).json(), range(2)))
        for answer in answers:
            assert answer["status"] == "COMPLETED", answer
            (out,) = answer["output"]
            assert out["choices"][0]["message"]["content"] == "together", answer
    finally:
        api.stop()
        backend.shutdown()


def test_job_scaler_takes_as_many_jobs_as_the_engine_batches(monkeypatch):
    from runpod.serverless.modules.rp_scale import JobScaler

    handler = load("runpod/handler.py")
    n = random.randint(3, 40)
    monkeypatch.setenv("EDGE_LLM_MAX_NUM_SEQS", str(n))
    scaler = JobScaler(dict(handler.CONFIG))
    asyncio.run(scaler.set_scale())
    assert scaler.current_concurrency == n
    assert handler.CONFIG["return_aggregate_stream"] is True


def test_readme_endpoint_scales_zero_to_n_below_the_worker_concurrency(monkeypatch):
    """The README's SDK snippet, run against the installed SDK's signatures: Request Count
    scaling at SCALE_TARGET per worker, below the jobs one worker takes (its
    concurrency_modifier: the template environment's --max-num-seqs)."""
    import inspect
    import re

    import runpod

    calls: dict[str, inspect.BoundArguments] = {}

    def fake(name, answer):
        real = inspect.signature(getattr(runpod, name))

        def call(*args, **kwargs):
            calls[name] = real.bind(*args, **kwargs)  # TypeError on an unknown argument
            return answer
        return call

    monkeypatch.setattr(runpod, "create_template", fake("create_template", {"id": "tpl"}))
    monkeypatch.setattr(runpod, "create_endpoint", fake("create_endpoint", {"id": "ep"}))
    text = (RECIPES / "runpod" / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                if "create_endpoint" in b]
    exec(compile(block, "README.md", "exec"), {})
    endpoint = calls["create_endpoint"].arguments
    assert endpoint["template_id"] == "tpl"
    assert endpoint["scaler_type"] == "REQUEST_COUNT"
    assert endpoint["workers_min"] == 0 and endpoint["workers_max"] == DEFAULT_MAX_REPLICAS > 1
    env = calls["create_template"].arguments["env"]
    assert all(isinstance(v, str) for v in env.values())
    args = resolved(image_env() | env)
    assert endpoint["scaler_value"] == SCALE_TARGET < args.max_num_seqs == REPLICA_CONCURRENCY
    assert args.max_queue is not None and args.max_queue >= args.max_num_seqs
    handler = load("runpod/handler.py")  # the worker takes that many jobs at once
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert handler.CONFIG["concurrency_modifier"](0) == args.max_num_seqs
    # the load-balancing endpoint's settings in the README say the same
    assert "EDGE_LLM_MAX_NUM_SEQS=32" in text and "scaler Request Count, value 24" in text


def test_worker_image_installs_as_root_and_caches_on_the_network_volume():
    from tests.test_dockerfile import instructions

    text = (RECIPES / "runpod" / "Dockerfile").read_text()
    steps = instructions(text)
    users = [(i, rest) for i, (word, rest) in enumerate(steps) if word == "USER"]
    pip = next(i for i, (word, rest) in enumerate(steps)
               if word == "RUN" and "pip install" in rest)
    assert users and users[0][0] < pip and users[0][1] in ("0", "root")
    copy = next(rest for word, rest in steps if word == "COPY")
    source = copy.split()[0]
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "recipes" in ignore and f"!{source}" in ignore  # excluded dirs need an exception
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert "EDGE_LLM_CACHE_DIR=/runpod-volume/" in env
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["python", "/opt/edge-llm/handler.py"]


def test_worker_runs_the_server_in_process(monkeypatch, fake_tokenizer):
    """No EDGE_LLM_URL (the worker image): the handler starts the server in its own process
    on the demo model, once, and serves a job through it."""
    for name in [k for k in os.environ if k.startswith("EDGE_LLM_") and k != "EDGE_LLM_CACHE_DIR"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("EDGE_LLM_MAX_MODEL_LEN", "256")
    handler = load("runpod/handler.py")
    try:
        (answer,) = collect(handler, {"id": "job-1", "input": {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}})
        assert answer["usage"]["completion_tokens"] == 3, answer
        first = handler._server
        assert handler.server_url() == first.url and first.url.startswith("http://127.0.0.1:")
    finally:
        if handler._server is not None:
            handler._server.stop()
