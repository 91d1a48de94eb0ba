"""The engine's life in the server: load in the background, admit requests, stop.

Built for scale-to-zero platforms: the port opens at once, the weights load in a daemon thread
(so a shutdown while loading does not wait for it), and ``/v1`` requests that arrive meanwhile
wait for readiness (up to ``ready_timeout``) instead of failing.

    state:  loading --(factory returned, engine.start())--> ready
               \\--(factory raised)--> failed          (health 503 with the reason)
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import OpenAIError

logger = logging.getLogger("edge_llm.server")

EngineFactory = Callable[[], Any]  # blocking; returns an AsyncEngine-like object


class EngineHolder:
    """Owns the engine object and the admission counter of one app.

    ``max_num_seqs`` is how many requests the engine runs at once; ``max_queue`` (None: no
    limit) is how many more may wait. Past that, requests get 429 with ``Retry-After``.
    """

    def __init__(
        self,
        factory: EngineFactory,
        *,
        ready_timeout: float,
        max_num_seqs: int,
        max_queue: int | None,
        retry_after: int = 1,
        on_load_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._factory = factory
        self.ready_timeout = ready_timeout
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.retry_after = retry_after
        self.on_load_failure = on_load_failure
        self.engine: Any = None
        self.error: str | None = None
        self.load_seconds: float | None = None
        self.in_flight = 0  # engine requests admitted and not yet finished
        self._done: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    @property
    def state(self) -> str:
        if self.engine is not None:
            return "ready"
        return "failed" if self.error is not None else "loading"

    # ---- lifespan --------------------------------------------------------------------------
    async def start_loading(self) -> None:
        """Begin loading in the background; returns at once (call inside the event loop)."""
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._load(), name="edge-llm-load")

    async def _load(self) -> None:
        assert self._done is not None
        start = time.perf_counter()
        try:
            engine = await _run_in_daemon_thread(self._factory)
            await engine.start()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any load failure is reported, not raised
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("The model failed to load: %s", self.error)
            if self.on_load_failure is not None:
                self.on_load_failure(exc)
        else:
            self.engine = engine
            self.load_seconds = time.perf_counter() - start
            logger.info("Model %s ready in %.1f s", getattr(engine, "model_name", "?"),
                        self.load_seconds)
        finally:
            self._done.set()

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the loading thread is a daemon: it dies with the process
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.engine is not None:
            await self.engine.stop()
            self.engine = None

    # ---- requests --------------------------------------------------------------------------
    async def wait_ready(self) -> Any:
        """The engine, waiting up to ``ready_timeout`` while it loads; 503 if not there."""
        if self.engine is not None:
            return self.engine
        if self._done is None:
            raise self._unavailable("The server is starting; the model is not loading yet.")
        if self.error is None:
            try:
                await asyncio.wait_for(self._done.wait(), timeout=self.ready_timeout)
            except asyncio.TimeoutError:
                raise self._unavailable(
                    f"The model is still loading after {self.ready_timeout:g} s; retry later."
                ) from None
        if self.engine is None:
            raise self._unavailable(f"The model failed to load: {self.error}")
        return self.engine

    def _unavailable(self, message: str) -> OpenAIError:
        return OpenAIError(503, message, code="model_not_ready",
                           headers={"Retry-After": str(self.retry_after)})

    def acquire(self, num_requests: int = 1) -> Ticket:
        """Count ``num_requests`` engine requests in flight until the ticket is released;
        429 with ``Retry-After`` when the waiting queue is full.

        The engine runs ``max_num_seqs`` requests at once, so requests beyond that wait: the
        queue is full when ``in_flight + new - max_num_seqs`` would exceed ``max_queue``.
        """
        if self.max_queue is not None:
            waiting_after = self.in_flight + num_requests - self.max_num_seqs
            if waiting_after > self.max_queue:
                raise OpenAIError(
                    429,
                    f"The server is busy: {max(self.in_flight - self.max_num_seqs, 0)} requests "
                    f"are waiting (max_queue={self.max_queue}); retry later.",
                    code="queue_full",
                    headers={"Retry-After": str(self.retry_after)},
                )
        self.in_flight += num_requests
        return Ticket(self, num_requests)


class Ticket:
    """Admission of some engine requests; ``release()`` is idempotent."""

    def __init__(self, holder: EngineHolder, count: int) -> None:
        self._holder = holder
        self._count = count

    def release(self) -> None:
        self._holder.in_flight -= self._count
        self._count = 0


def _run_in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future:
    """Run blocking ``fn`` in a daemon thread; the result arrives as an awaitable future."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        if not fut.done():
            setter(value)

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            setter, value = fut.set_exception, exc
        else:
            setter, value = fut.set_result, result
        try:
            loop.call_soon_threadsafe(deliver, setter, value)
        except RuntimeError:  # the loop closed while loading: nobody is waiting
            pass

    threading.Thread(target=work, name="edge-llm-load", daemon=True).start()
    return fut
