"""RunPod queue worker: ``runpod.serverless.start`` with an async generator handler yielding
OpenAI chunks (``/stream`` gets them as they come; ``return_aggregate_stream`` gives ``/run``
and ``/runsync`` the list) and a ``concurrency_modifier``, so one worker serves up to
``--max-num-seqs`` jobs at once, batched by the engine (as RunPod's worker-vllm does).

Job input (``job["input"]``): an OpenAI chat body (``messages``) or completions body
(``prompt``); ``"stream": true`` yields each chunk, otherwise one full response is yielded.
The worker runs the edge-llm server in this process (started and loaded before the first job
is taken unless ``EDGE_LLM_PRELOAD=0``, then on the first job) unless ``EDGE_LLM_URL`` points
at a server already running. Settings come from the ``EDGE_LLM_*`` variables, as for
``serve``. Local runs: ``python handler.py --test_input '{"input": {...}}'`` (one job) or
``python handler.py --rp_serve_api`` (RunPod's local API server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from edge_llm import envs
from edge_llm.flags import option_env

_server: Any = None  # the in-process server (edge_llm.server.terminal_chat.ThreadedServer)
_server_lock = threading.Lock()  # concurrent first jobs start one server


def serve_options() -> argparse.Namespace:
    """The ``edge-llm serve`` options the ``EDGE_LLM_*`` environment gives."""
    from edge_llm.cli import SERVE_OPTIONS, resolve_options

    args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
    args.model = envs.MODEL.get()
    args.port_given = True
    resolve_options(args, SERVE_OPTIONS)
    return args


def server_url() -> str:
    """``EDGE_LLM_URL``, else the in-process server's URL (started and loaded on first use)."""
    global _server
    url = envs.URL.get()
    if url:
        return url.rstrip("/")
    with _server_lock:
        if _server is None:
            _server = start_server()
    return _server.url


def start_server() -> Any:
    """The server in this process, on a free loopback port; it loads in the background."""
    from edge_llm.cli import build_configs, build_lifecycle
    from edge_llm.server import create_app
    from edge_llm.server.hooks import set_compile_cache_env
    from edge_llm.server.terminal_chat import ThreadedServer

    set_compile_cache_env()  # before torch loads: the network volume's kernels are reused
    args = serve_options()
    engine_cfg, server_cfg = build_configs(args)
    app = create_app(engine_cfg, server_cfg, lifecycle=build_lifecycle(args))
    server = ThreadedServer(app, host="127.0.0.1")
    server.start()
    return server


def max_concurrency() -> int:
    """Jobs one worker takes at once: the engine's ``--max-num-seqs`` (it batches them)."""
    return serve_options().max_num_seqs


def concurrency_modifier(current: int) -> int:
    """RunPod's JobScaler asks this before taking jobs: always the engine's batch size."""
    return max_concurrency()


def wait_ready(url: str, timeout: float = 1800.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"edge-llm at {url} not ready after {timeout:.0f} s")


def route_of(body: dict[str, Any]) -> str:
    """The OpenAI route for a job input; ValueError naming the fields otherwise."""
    if not isinstance(body, dict) or ("messages" in body) == ("prompt" in body):
        raise ValueError("job input must be an OpenAI body with 'messages' (chat) or 'prompt' "
                         "(completions)")
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


async def handler(job: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """Yield OpenAI chunks (stream) or one response; an error yields ``{"error": ...}``."""
    import httpx

    body = job.get("input")
    try:
        path = route_of(body)
    except ValueError as exc:
        yield {"error": str(exc)}
        return
    url = await asyncio.to_thread(server_url)
    await asyncio.to_thread(wait_ready, url)
    headers = {"X-Request-Id": str(job.get("id", ""))[:128] or "runpod"}
    key = option_env("--api-key")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with httpx.AsyncClient(base_url=url, timeout=None, headers=headers) as client:
        if not body.get("stream"):
            r = await client.post(path, json=body)
            yield r.json() if r.status_code == 200 else {"error": r.json()["error"]}
            return
        async with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                await r.aread()
                yield {"error": r.json()["error"]}
                return
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[len("data: "):])


CONFIG = {"handler": handler, "concurrency_modifier": concurrency_modifier,
          "return_aggregate_stream": True}

if __name__ == "__main__":
    import runpod  # the RunPod SDK, installed in the worker image only

    if envs.PRELOAD.get():
        wait_ready(server_url())  # load before taking jobs: the first job pays nothing
    runpod.serverless.start(CONFIG)
