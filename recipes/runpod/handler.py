"""RunPod queue worker: ``runpod.serverless.start`` with a generator handler yielding OpenAI
chunks (``/stream`` gets them as they come; ``return_aggregate_stream`` gives ``/run`` and
``/runsync`` the list).

Job input (``job["input"]``): an OpenAI chat body (``messages``) or completions body
(``prompt``); ``"stream": true`` yields each chunk, otherwise one full response is yielded.
The worker runs the edge-llm server in this process (started before the first job is taken
unless ``EDGE_LLM_PRELOAD=0``, then on the first job) unless ``EDGE_LLM_URL`` points at a
server already running. Settings come from the ``EDGE_LLM_*`` variables, as for ``serve``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from edge_llm import envs
from edge_llm.flags import option_env

_server: Any = None  # the in-process server (edge_llm.server.terminal_chat.ThreadedServer)


def server_url() -> str:
    """``EDGE_LLM_URL``, else the in-process server's URL (started and loaded on first use)."""
    global _server
    url = envs.URL.get()
    if url:
        return url.rstrip("/")
    if _server is None:
        import argparse

        from edge_llm.cli import SERVE_OPTIONS, build_configs, build_lifecycle, resolve_options
        from edge_llm.server import create_app
        from edge_llm.server.terminal_chat import ThreadedServer

        args = argparse.Namespace(**{o.dest: None for o in SERVE_OPTIONS})
        args.model = envs.MODEL.get()
        args.port_given = True
        resolve_options(args, SERVE_OPTIONS)
        engine_cfg, server_cfg = build_configs(args)
        app = create_app(engine_cfg, server_cfg, lifecycle=build_lifecycle(args))
        _server = ThreadedServer(app, host="127.0.0.1")
        _server.start()
    return _server.url


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


def handler(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield OpenAI chunks (stream) or one response; an error yields ``{"error": ...}``."""
    import httpx

    body = job.get("input")
    try:
        path = route_of(body)
    except ValueError as exc:
        yield {"error": str(exc)}
        return
    url = server_url()
    wait_ready(url)
    headers = {"X-Request-Id": str(job.get("id", ""))[:128] or "runpod"}
    key = option_env("--api-key")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    with httpx.Client(base_url=url, timeout=None, headers=headers) as client:
        if not body.get("stream"):
            r = client.post(path, json=body)
            yield r.json() if r.status_code == 200 else {"error": r.json()["error"]}
            return
        with client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                r.read()
                yield {"error": r.json()["error"]}
                return
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[len("data: "):])


if __name__ == "__main__":
    import runpod  # the RunPod SDK, installed in the worker image only

    if envs.PRELOAD.get():
        wait_ready(server_url())  # load before taking jobs: the first job pays nothing
    runpod.serverless.start({"handler": handler, "return_aggregate_stream": True})
