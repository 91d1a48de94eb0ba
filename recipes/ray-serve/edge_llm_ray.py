"""edge-llm engines as Ray Serve replicas: the same OpenAI routes, streaming, autoscaling 0..N.

Each replica runs the whole edge-llm app (``create_app``: one engine, its Litestar routes,
/metrics) behind Ray Serve's HTTP proxy, which routes each request to a replica and queues it
there once every replica holds ``max_ongoing_requests``. Ray Serve's autoscaler adds replicas
while the ongoing requests per replica stay above ``target_ongoing_requests`` and removes them
when idle, down to ``min_replicas`` (0: scale to zero; the next request starts one and waits).

A replica counts as started (Ray routes to it) only once its engine is loaded and warmed up:
the first health check waits for it. Every response carries ``x-edge-llm-replica`` (the Ray
replica id), so routing can be seen from a client.

Run (from this folder):  serve run edge_llm_ray:build_app max_replicas=2 \
    serve_args="--max-num-seqs 8"
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
from collections.abc import AsyncIterator
from typing import Any

from affinity import ConversationAffinityRouter, forwarded_headers, http_scope
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import StreamingResponse

REPLICA_HEADER = b"x-edge-llm-replica"


def build_edge_llm_app(serve_args: list[str]) -> Any:
    """The edge-llm Litestar app for ``edge-llm serve`` flags (host/port are Ray's, ignored).
    Raises ValueError naming the flag on bad flags."""
    from edge_llm.cli import build_configs, build_lifecycle, build_parser, resolve_options
    from edge_llm.flags import SERVE_OPTIONS
    from edge_llm.server import create_app

    try:
        args = build_parser().parse_args(["serve", *serve_args])
    except SystemExit as exc:  # argparse already printed the one-line reason
        raise ValueError(f"bad edge-llm serve flags: {shlex.join(serve_args)}") from exc
    args.port_given = True
    resolve_options(args, SERVE_OPTIONS)
    engine_cfg, server_cfg = build_configs(args)
    return create_app(engine_cfg, server_cfg, lifecycle=build_lifecycle(args))


def with_replica_header(app: Any, replica_id: str) -> Any:
    """``app`` answering every HTTP response with ``x-edge-llm-replica: replica_id``."""
    value = replica_id.encode()

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)

        async def send_tagged(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER, value)]}
            await send(message)

        await app(scope, receive, send_tagged)

    return wrapped


@serve.ingress()
class EdgeLLMDeployment:
    """One engine per replica; the app is built on the replica (torch never in the driver)."""

    def __init__(self, serve_args: list[str], load_timeout_s: float = 1800.0) -> None:
        self._serve_args = list(serve_args)
        self._load_timeout_s = load_timeout_s
        self._app: Any = None
        self._tagged: Any = None
        self._started = False

    def __serve_build_asgi_app__(self) -> Any:
        self._app = build_edge_llm_app(self._serve_args)
        replica_id = serve.get_replica_context().replica_id.unique_id
        self._tagged = with_replica_header(self._app, replica_id)
        return self._tagged

    async def forward(self, method: str, path: str, query: str, headers: list[Any],
                      body: bytes) -> AsyncIterator[Any]:
        """One HTTP request through this replica's app, for ``AffinityIngress``: yields
        ``("start", status, headers)``, then the body's chunks as the app sends them. Closing
        the generator (the client left) cancels the request in the app."""
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Future()  # never a disconnect: a client that leaves cancels the task
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            await queue.put(message)

        task = asyncio.create_task(self._tagged(http_scope(method, path, query, headers),
                                                receive, send))
        task.add_done_callback(lambda _: queue.put_nowait(done))
        try:
            while (message := await queue.get()) is not done:
                if message["type"] == "http.response.start":
                    yield ("start", message["status"], message.get("headers", []))
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        return
            task.result()  # the app ended before its body did: its exception, if any
            raise RuntimeError(f"{method} {path}: the app ended without a complete response")
        finally:
            task.cancel()

    async def check_health(self) -> None:
        """The first call (replica start-up) waits for the engine to load and warm up; later
        calls fail if the engine failed, so that Ray replaces the replica."""
        holder = self._app.state.ctx.holder
        if not self._started:
            await asyncio.wait_for(self._until_loaded(holder), self._load_timeout_s)
            self._started = True
        if holder.state == "failed":
            raise RuntimeError(f"edge-llm engine failed: {holder.error}")

    @staticmethod
    async def _until_loaded(holder: Any) -> None:
        while holder.state in ("loading", "warming"):
            await asyncio.sleep(0.2)


@serve.deployment(ray_actor_options={"num_cpus": 0.1})
class AffinityIngress:
    """The HTTP entry of the affinity app: reads the body so that the engine replicas' router
    can see the conversation (see affinity.py), and streams the chosen replica's answer."""

    def __init__(self, engine: DeploymentHandle) -> None:
        self._engine = engine.options(stream=True)

    async def __call__(self, request: Request) -> StreamingResponse:
        body = await request.body()
        answer = self._engine.forward.remote(request.method, request.url.path,
                                             request.url.query, list(request.headers.raw), body)
        _, status, headers = await answer.__anext__()

        async def chunks() -> AsyncIterator[bytes]:
            async for chunk in answer:
                yield chunk

        return StreamingResponse(chunks(), status_code=status, headers=forwarded_headers(headers))


def deployment(serve_args: list[str], *, min_replicas: int = 0, max_replicas: int = 2,
               initial_replicas: int | None = None, target_ongoing_requests: float = 4,
               max_ongoing_requests: int = 8, upscale_delay_s: float = 10,
               downscale_delay_s: float = 300, num_cpus: float = 1, num_gpus: float = 0,
               health_check_timeout_s: float = 1800, affinity: bool = False) -> Application:
    """The Ray Serve application. ``max_ongoing_requests`` should equal edge-llm's
    ``--max-num-seqs`` (more would queue inside the engine, where another replica cannot take
    them); ``target_ongoing_requests`` is where the autoscaler adds a replica (a fraction of
    it: the queue depth at which latency starts to degrade). ``affinity``: route each
    conversation's turns to one replica (``AffinityIngress`` in front, see affinity.py)."""
    autoscaling = {"min_replicas": min_replicas, "max_replicas": max_replicas,
                   "target_ongoing_requests": target_ongoing_requests,
                   "upscale_delay_s": upscale_delay_s, "downscale_delay_s": downscale_delay_s}
    if initial_replicas is not None:
        autoscaling["initial_replicas"] = initial_replicas
    routing = {"request_router_config": RequestRouterConfig(
        request_router_class=ConversationAffinityRouter)} if affinity else {}
    engines = serve.deployment(
        EdgeLLMDeployment, name="edge-llm", autoscaling_config=autoscaling,
        max_ongoing_requests=max_ongoing_requests, health_check_period_s=10,
        health_check_timeout_s=health_check_timeout_s,
        ray_actor_options={"num_cpus": num_cpus, "num_gpus": num_gpus}, **routing,
    ).bind(serve_args)
    return AffinityIngress.bind(engines) if affinity else engines


def build_app(args: dict[str, str]) -> Application:
    """``serve run edge_llm_ray:build_app key=value ...``: ``serve_args`` (edge-llm serve
    flags, one string), ``min_replicas``, ``max_replicas``, ``target_ongoing_requests``,
    ``max_ongoing_requests`` (default: --max-num-seqs), ``downscale_delay_s``, ``num_gpus``
    (default 1 per replica), ``affinity`` (true: conversation affinity)."""
    parser = argparse.ArgumentParser(prog="edge_llm_ray:build_app")
    serve_args = shlex.split(args.get("serve_args", ""))
    max_num_seqs = _flag_value(serve_args, "--max-num-seqs")
    known = {"min_replicas": int, "max_replicas": int, "target_ongoing_requests": float,
             "max_ongoing_requests": int, "downscale_delay_s": float, "upscale_delay_s": float,
             "num_gpus": float, "num_cpus": float, "affinity": _parse_bool}
    unknown = set(args) - set(known) - {"serve_args"}
    if unknown:
        parser.error(f"unknown argument(s) {sorted(unknown)}; known: serve_args, "
                     + ", ".join(known))
    kw = {k: t(args[k]) for k, t in known.items() if k in args}
    kw.setdefault("max_ongoing_requests", max_num_seqs)
    kw.setdefault("target_ongoing_requests", max(1.0, kw["max_ongoing_requests"] / 2))
    kw.setdefault("num_gpus", 1.0)
    return deployment(serve_args, **kw)


def _parse_bool(text: str) -> bool:
    from edge_llm.flags import parse_bool

    return parse_bool(text)


def _flag_value(serve_args: list[str], flag: str) -> int:
    """An integer flag's value in ``serve_args``, else edge-llm's default for it."""
    from edge_llm.flags import SERVE_OPTIONS

    default = next(o.default for o in SERVE_OPTIONS if o.flag == flag)
    for i, arg in enumerate(serve_args):
        if arg == flag and i + 1 < len(serve_args):
            return int(serve_args[i + 1])
        if arg.startswith(flag + "="):
            return int(arg.split("=", 1)[1])
    return default
