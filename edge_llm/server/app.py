"""``create_app()``: the Litestar application serving one engine.

Lifecycle (scale-to-zero friendly): ``lifespan`` starts loading the engine in a background thread
and returns at once, so the port opens immediately; ``/health`` says 503 until the engine is
loaded and warmed up; ``/v1`` requests wait for it (bounded by ``ServerConfig.ready_timeout``).
The rest of the life (warm-up, hooks, idle sleep, drain) is set by a ``LifecycleConfig``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from edge_llm.config import EngineConfig, ServerConfig
from edge_llm.engine.device_prep import start_device_prep

from . import openapi
from .context import USAGE_KEY, ServerContext
from .engine_api import ServingEngine
from .errors import handle_exception
from .guard import RequestGuard
from .hooks import Hooks, LifecycleConfig, StartupPhases, builtin_warmup, user_warmup
from .lifecycle import EngineHolder, Warmup
from .metrics import ServerMetrics, engine_stats, usage_from_trackers
from .preprocess import read_chat_template
from .request_defaults import resolve_request_defaults
from .routes import ROUTES, SAGEMAKER_ROUTES, SLEEP_ROUTES

logger = logging.getLogger("edge_llm.server")


def create_app(
    engine_config: EngineConfig | None = None,
    server_config: ServerConfig | None = None,
    *,
    engine_factory: Callable[[], ServingEngine] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
    lifecycle: LifecycleConfig | None = None,
) -> Litestar:
    """Build the app. ``engine_factory`` (blocking, run in a thread) defaults to
    ``AsyncEngine.from_config(engine_config)``; tests pass their own. ``on_load_failure`` is
    called (in the event loop) if loading raises, e.g. to stop the process. ``lifecycle``
    (default: built-in warm-up on for the default factory, no idle sleep) sets warm-up, hooks,
    idle sleep and the SageMaker routes.

    Raises ValueError for a ``chat_template`` that is neither a file nor a template, or a hook
    that cannot be imported.
    """
    engine_config = engine_config or EngineConfig()
    server_config = server_config or ServerConfig()
    # a caller's own factory (a test double) gets no built-in warm-up unless asked for
    lifecycle = lifecycle or LifecycleConfig(warmup=engine_factory is None)
    phases = StartupPhases()
    if engine_factory is None:
        engine_factory = _default_factory(engine_config, phases)
    hooks = Hooks.from_specs(lifecycle.hooks)
    chat_template = read_chat_template(server_config.chat_template)
    factory = engine_factory

    def load_engine() -> ServingEngine:
        """The engine, then the defaults of the model it loaded (``ctx`` exists by then: the
        holder calls this once the app runs)."""
        engine = factory()
        ctx.defaults = resolve_request_defaults(server_config.generation_config,
                                                engine.model_path,
                                                server_config.default_max_tokens)
        return engine

    holder = _holder(load_engine, engine_config, server_config, lifecycle, on_load_failure,
                     hooks, phases, chat_template)
    ctx = ServerContext(
        config=server_config,
        holder=holder,
        metrics=ServerMetrics(lambda: engine_stats(holder), lambda: ctx.model_name(),
                              phases=lambda: phases.seconds),
        chat_template=chat_template,
    )

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await holder.start_loading()
        try:
            yield
        finally:
            await holder.shutdown()
            ctx.preprocess_executor.shutdown(wait=False, cancel_futures=True)

    from edge_llm import __version__

    routes = ROUTES + (SLEEP_ROUTES if server_config.enable_sleep_endpoints else []) + (
        SAGEMAKER_ROUTES if lifecycle.sagemaker else [])
    app = Litestar(
        route_handlers=routes,
        cors_config=_cors(server_config),
        lifespan=[lifespan],
        exception_handlers={Exception: handle_exception},
        request_max_body_size=server_config.max_body_bytes,
        openapi_config=OpenAPIConfig(title="edge-llm", version=__version__,
                                     render_plugins=openapi.render_plugins()),
        logging_config=None,
    )
    app.state.ctx = ctx
    hooks.state = app.state
    guarded = RequestGuard(app.asgi_handler, bind_host=server_config.host,
                           allowed_hosts=server_config.allowed_hosts,
                           allowed_origins=server_config.allowed_origins,
                           body_read_timeout=server_config.body_read_timeout)
    # Wrapped outside Litestar's router so that unmatched routes (404/405) and the guard's
    # refusals are logged too.
    app.asgi_handler = RequestLog(guarded, enabled=server_config.log_requests,
                                  metrics=ctx.metrics)
    return app


def _cors(config: ServerConfig) -> CORSConfig | None:
    """CORS headers only for the origins the operator listed (vLLM's flags)."""
    if not config.allowed_origins:
        return None
    return CORSConfig(allow_origins=list(config.allowed_origins),
                      allow_methods=list(config.allowed_methods),  # type: ignore[arg-type]
                      allow_headers=list(config.allowed_headers),
                      allow_credentials=config.allow_credentials)


def _holder(factory: Callable[[], ServingEngine], engine_config: EngineConfig,
            server_config: ServerConfig, lifecycle: LifecycleConfig,
            on_load_failure: Callable[[BaseException], None] | None, hooks: Hooks,
            phases: StartupPhases, chat_template: str | None) -> EngineHolder:
    max_num_seqs = engine_config.scheduler.max_num_seqs
    return EngineHolder(
        factory,
        ready_timeout=server_config.ready_timeout,
        max_num_seqs=max_num_seqs,
        max_queue=server_config.max_queue,
        retry_after=server_config.retry_after,
        on_load_failure=on_load_failure,
        warmup=_warmup(lifecycle, max_num_seqs, chat_template),
        hooks=hooks,
        phases=phases,
        idle_sleep_s=lifecycle.idle_sleep_s,
        sleep_level=lifecycle.sleep_level,
        freeze_gc=lifecycle.freeze_gc,
    )


def _default_factory(config: EngineConfig, phases: StartupPhases
                     ) -> Callable[[], ServingEngine]:
    def load() -> ServingEngine:
        began = time.perf_counter()
        # the CUDA context and Triton's key beside the imports (`edge-llm serve` began it
        # earlier: this call then returns the running one)
        prep = start_device_prep(config.model.device)
        from edge_llm.engine.async_engine import AsyncEngine  # torch loads here, off the loop

        # done by now, as a rule; else waiting here costs what the load would spend on it
        prepared = prep.join()
        phases.record("import", time.perf_counter() - began, "torch and the engine")
        phases.record_device_prep(prepared)
        return AsyncEngine.from_config(config)

    return load


def _warmup(lifecycle: LifecycleConfig, max_num_seqs: int, chat_template: str | None
            ) -> Warmup | None:
    """The warm-up run before ready: the built-in shapes, then the user's requests."""
    if not lifecycle.warmup and not lifecycle.warmup_prompts:
        return None

    async def warm(engine: ServingEngine) -> None:
        tokens = 0
        if lifecycle.warmup:
            tokens += await builtin_warmup(engine, lifecycle, max_num_seqs)
        if lifecycle.warmup_prompts:
            tokens += await user_warmup(engine, lifecycle.warmup_prompts, chat_template)
        logger.info("Warm-up generated %d tokens", tokens)

    return warm


class RequestLog:
    """ASGI wrapper: ``X-Request-Id`` in and out, one info line per HTTP request (method, path,
    status, request id, prompt/completion tokens, seconds) and its count in ``metrics``.

    A response whose body never reached its end (the client left mid-stream) is a 499, as is
    one abandoned before it started; its tokens are those the engine produced for it."""

    def __init__(self, app: ASGIApp, enabled: bool = True,
                 metrics: ServerMetrics | None = None) -> None:
        self.app = app
        self.enabled = enabled
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = request_id
        status = 0
        body_done = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, body_done
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body_done = True

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if status and not body_done:
                status = 499
            if status and self.metrics is not None:
                self.metrics.observe_http(scope.get("path_template"), scope["method"], status)
            if self.enabled:
                self._log(scope, status, request_id, time.perf_counter() - start)

    @staticmethod
    def _log(scope: Scope, status: int, request_id: str, seconds: float) -> None:
        state = scope["state"]
        usage = state.get(USAGE_KEY)
        if usage is None or status == 499:  # what the engine produced before the end
            usage = usage_from_trackers(state) or usage or (0, 0)
        logger.info("%s %s %s id=%s prompt_tokens=%d completion_tokens=%d %.3fs",
                    scope["method"], scope["path"], status or "-", request_id, usage[0],
                    usage[1], seconds)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            text = value.decode("latin-1").strip()
            if text and len(text) <= 128 and text.isprintable():
                return text
    return None
