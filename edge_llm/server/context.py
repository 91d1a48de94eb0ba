"""Per-app server state shared by the routes (kept in ``app.state.ctx``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from litestar import Request

from edge_llm.config import ServerConfig

from .engine_api import ServingEngine
from .errors import ClientDisconnected
from .lifecycle import EngineHolder
from .logprobs import TokenTexts
from .metrics import ServerMetrics
from .request_defaults import RequestDefaults

T = TypeVar("T")

USAGE_KEY = "edge_llm_usage"  # scope["state"] key read by the request log line


@dataclass
class ServerContext:
    config: ServerConfig
    holder: EngineHolder
    metrics: ServerMetrics
    chat_template: str | None  # the override's text; None: the tokenizer's own
    created: int = field(default_factory=lambda: int(time.time()))
    # fields a request leaves out; set once the model is loaded (its generation_config.json)
    defaults: RequestDefaults = field(default_factory=RequestDefaults)
    _texts: TokenTexts | None = None
    # chat-template rendering and tokenizing run here, off the event loop, one at a time (a
    # tokenizer object is not safe to use from several threads at once)
    preprocess_executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="edge-llm-preprocess"))

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the preprocessing thread: a long prompt keeps /health answering."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.preprocess_executor, partial(fn, *args))

    def model_name(self) -> str:
        """The name responses carry: ``served_model_name``, else the engine's model name."""
        if self.config.served_model_name:
            return self.config.served_model_name
        engine = self.holder.engine
        return (engine.model_name if engine is not None else None) or "edge-llm"

    def served_names(self) -> list[str]:
        """Names a request's ``model`` may use (the served name and the engine's own)."""
        names = [self.model_name()]
        engine = self.holder.engine
        own = engine.model_name if engine is not None else None
        if own and own not in names:
            names.append(own)
        return names

    def token_texts(self, engine: ServingEngine) -> TokenTexts:
        if self._texts is None or self._texts.tokenizer is not engine.tokenizer:
            self._texts = TokenTexts(engine.tokenizer)
        return self._texts


def record_usage(request: Request, prompt_tokens: int, completion_tokens: int) -> None:
    request.scope["state"][USAGE_KEY] = (prompt_tokens, completion_tokens)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (its engine requests abort) if the client goes away.

    Call after the body was read: the next ASGI message is then the disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
