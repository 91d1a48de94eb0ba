"""The engine's life in the server: load in the background, admit requests, sleep, stop.

Built for scale-to-zero platforms: the port opens at once, the weights load in a daemon thread
(so a shutdown while loading does not wait for it), and ``/v1`` requests that arrive meanwhile
wait for readiness (up to ``ready_timeout``) instead of failing.

    loading --(factory, engine.start(), on_load, warm-up)--> ready <--(wake_up)-- asleep
       \\--(factory or warm-up raised)--> failed            \\--(sleep: idle or POST)--^
    any --(SIGTERM: begin_drain)--> draining               (new requests 503; in-flight finish)

A request to a sleeping engine wakes it and waits; ``/health`` says 503 "asleep" meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .engine_api import ServingEngine
from .errors import OpenAIError
from .hooks import Hooks, StartupPhases

logger = logging.getLogger("edge_llm.server")

EngineFactory = Callable[[], ServingEngine]  # blocking; returns the engine to serve
Warmup = Callable[[ServingEngine], Awaitable[None]]  # given the started engine; runs before ready


class EngineHolder:
    """Owns the engine object, its sleep state and the admission counter of one app.

    ``max_num_seqs`` is how many sequences the engine runs at once; ``max_queue`` (None: no
    limit) is how many more may wait. Past that, requests get 429 with ``Retry-After``.
    ``warmup`` runs after loading and before ready; ``hooks`` get the lifecycle events;
    ``idle_sleep_s`` (None: never) sleeps the engine at ``sleep_level`` after that long idle.
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
        warmup: Warmup | None = None,
        hooks: Hooks | None = None,
        phases: StartupPhases | None = None,
        idle_sleep_s: float | None = None,
        sleep_level: int = 1,
        freeze_gc: bool = False,
    ) -> None:
        self._factory = factory
        self.freeze_gc = freeze_gc  # LifecycleConfig.freeze_gc
        self.ready_timeout = ready_timeout
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.retry_after = retry_after
        self.on_load_failure = on_load_failure
        self.warmup = warmup
        self.hooks = hooks or Hooks()
        self.phases = phases or StartupPhases()
        self.idle_sleep_s = idle_sleep_s
        self.sleep_level = sleep_level
        self.engine: ServingEngine | None = None  # set once ready (after warm-up)
        self.error: str | None = None
        self.load_seconds: float | None = None
        self.in_flight = 0  # sequences admitted and not yet finished
        self.asleep = False
        self.waking = False
        self.warming = False
        self.draining = False
        self.last_activity = time.monotonic()
        self._done: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._idle_task: asyncio.Task | None = None
        self._notice_task: asyncio.Task | None = None
        self.notice_every_s = 30.0  # a "still loading" line this often while not ready
        self._sleep_lock: asyncio.Lock | None = None

    @property
    def state(self) -> str:
        """One of loading, warming, ready, asleep, waking, draining, failed."""
        if self.draining:
            return "draining"
        if self.engine is None:
            if self.error is not None:
                return "failed"
            return "warming" if self.warming else "loading"
        if self.waking:
            return "waking"
        return "asleep" if self.asleep else "ready"

    # ---- lifespan --------------------------------------------------------------------------
    async def start_loading(self) -> None:
        """Begin loading in the background; returns at once (call inside the event loop)."""
        self._done = asyncio.Event()
        self._sleep_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._load(), name="edge-llm-load")
        self._notice_task = asyncio.create_task(self._loading_notices(),
                                                name="edge-llm-loading-notice")
        if self.idle_sleep_s is not None:
            self._idle_task = asyncio.create_task(self._idle_loop(), name="edge-llm-idle")

    async def _load(self) -> None:
        assert self._done is not None
        start = time.perf_counter()
        engine = None
        if self.freeze_gc:
            gc.disable()  # until ready (LifecycleConfig.freeze_gc); back on in the finally
        try:
            engine = await _run_in_daemon_thread(self._factory)
            imported = self.phases.seconds.get("import", 0.0)  # the factory's own import time
            self.phases.record_engine(engine, time.perf_counter() - start - imported)
            await engine.start()
            await self.hooks.fire("on_load", strict=True)
            if self.warmup is not None:
                self.warming = True
                began = time.perf_counter()
                await self.warmup(engine)
                self.phases.record("warmup", time.perf_counter() - began)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any load failure is reported, not raised
            self.error = f"{type(exc).__name__}: {exc}"
            logger.error("The model failed to load: %s", self.error)
            if engine is not None:
                await engine.stop()
            if self.on_load_failure is not None:
                self.on_load_failure(exc)
        else:
            self.engine = engine
            self.load_seconds = time.perf_counter() - start
            self.last_activity = time.monotonic()
            self.phases.record_ready()
            logger.info("READY: model %s answers requests (loaded in %.1f s)",
                        engine.model_name, self.load_seconds)
            if self.freeze_gc:
                gc.collect()
                gc.freeze()
                logger.info("Froze %d start-up objects out of the cyclic GC",
                            gc.get_freeze_count())
            await self.hooks.fire("on_ready")
        finally:
            if self.freeze_gc:
                gc.enable()
            self.warming = False
            self._done.set()

    async def _loading_notices(self) -> None:
        """While loading (a long phase may log nothing for a minute), say so plainly."""
        began = time.monotonic()
        while True:
            await asyncio.sleep(self.notice_every_s)
            if self.state not in ("loading", "warming"):
                return
            logger.info("Still %s, NOT READY: %.0f s so far (the last lines say which phase)",
                        self.state, time.monotonic() - began)

    def begin_drain(self) -> None:
        """Stop admitting requests (503); those in flight go on. Called on SIGTERM."""
        if not self.draining:
            logger.info("Draining: %d sequences in flight; new requests get 503", self.in_flight)
        self.draining = True

    def interrupt_requests(self, drain_timeout: float) -> int:
        """End every engine request still running when the drain timed out: each stream
        ends with a 503 error event and ``[DONE]`` (a waiting response gets the 503), and
        the engine aborts them. Returns how many were ended."""
        if self.engine is None:
            return 0
        return self.engine.interrupt_all(lambda: OpenAIError(
            503, f"The server is shutting down: this request did not finish within the "
            f"{drain_timeout:g} s drain timeout.", code="shutting_down", logged=True,
            headers={"Retry-After": str(self.retry_after)}))

    async def shutdown(self) -> None:
        self.draining = True
        for task in (self._idle_task, self._notice_task, self._task):
            if task is not None and not task.done():
                task.cancel()  # the loading thread is a daemon: it dies with the process
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self.engine is not None:
            await self.engine.stop()
            self.engine = None
        if self.freeze_gc:
            gc.unfreeze()  # collectable again at exit (nanobind reports frozen objects as leaks)

    # ---- sleep -------------------------------------------------------------------------------
    async def sleep(self, level: int | None = None) -> bool:
        """Sleep the engine (KV cache freed; level 1: weights to host memory, 2: dropped).
        False if already asleep; 409 while requests are in flight; 503 if not loaded."""
        level = self.sleep_level if level is None else level
        if level not in (1, 2):
            raise OpenAIError(400, f"level must be 1 or 2, got {level}.", param="level")
        engine = self._loaded_engine()
        assert self._sleep_lock is not None
        async with self._sleep_lock:
            if self.asleep:
                return False
            if self.in_flight:
                raise self._busy(f"{self.in_flight} sequences are in flight")
            try:
                await engine.sleep(level)
            except ValueError as exc:  # the engine's own in-flight check
                raise self._busy(str(exc)) from exc
            except Exception as exc:
                logger.exception("The engine failed to go to sleep")
                raise self._unavailable(f"The engine failed to go to sleep: {exc}") from exc
            self.asleep = True
        logger.info("Engine asleep (level %d)", level)
        await self.hooks.fire("on_sleep")
        return True

    async def wake_up(self) -> bool:
        """Wake a sleeping engine (the weights come back); False if it was awake."""
        engine = self._loaded_engine()
        assert self._sleep_lock is not None
        async with self._sleep_lock:
            if not self.asleep:
                return False
            self.waking = True
            began = time.perf_counter()
            try:
                await engine.wake_up()
            except Exception as exc:
                logger.exception("The engine failed to wake up")
                raise self._unavailable(f"The engine failed to wake up: {exc}") from exc
            finally:
                self.waking = False
            self.asleep = False
            self.last_activity = time.monotonic()
        logger.info("Engine awake in %.2f s", time.perf_counter() - began)
        await self.hooks.fire("on_wake")
        return True

    def _loaded_engine(self) -> ServingEngine:
        if self.engine is None:
            raise self._unavailable(f"The model is not loaded ({self.state}).")
        return self.engine

    @staticmethod
    def _busy(why: str) -> OpenAIError:
        return OpenAIError(409, f"Cannot sleep: {why}; retry when they finish.",
                           code="requests_in_flight")

    async def _idle_loop(self) -> None:
        """Sleep the engine once it has been idle ``idle_sleep_s`` seconds."""
        assert self.idle_sleep_s is not None
        tick = min(1.0, self.idle_sleep_s / 4)
        while True:
            await asyncio.sleep(tick)
            idle = time.monotonic() - self.last_activity
            if (self.state == "ready" and self.in_flight == 0 and idle >= self.idle_sleep_s):
                try:
                    await self.sleep()
                except OpenAIError as exc:  # a request slipped in: try again later
                    logger.debug("Idle sleep skipped: %s", exc.message)
                except Exception:  # noqa: BLE001 - keep the watcher alive
                    logger.exception("Idle sleep failed")

    # ---- requests --------------------------------------------------------------------------
    async def admit(self, num_sequences: int) -> tuple[ServingEngine, Ticket]:
        """Admission, then the awake engine (``wait_ready``): the ticket counts the request's
        sequences before anything is awaited, so a sleep asked for meanwhile gets 409 and one
        already under way is waited for (then the engine wakes). 429 when the queue is full;
        the ticket is released if waiting fails."""
        ticket = self.acquire(num_sequences)
        try:
            engine = await self.wait_ready()
        except BaseException:
            ticket.release()
            raise
        return engine, ticket

    async def wait_ready(self) -> ServingEngine:
        """The awake engine, waiting up to ``ready_timeout`` while it loads and waking it if
        it sleeps or is going to sleep; 503 while draining or if it is not there."""
        if self.draining:
            raise self._unavailable("The server is shutting down.")
        self.last_activity = time.monotonic()
        if self.engine is None:
            await self._wait_loaded()
        assert self._sleep_lock is not None
        if self.asleep or self.waking or self._sleep_lock.locked():
            await self.wake_up()  # waits for a sleep or wake-up under way, then wakes
        self.last_activity = time.monotonic()
        return self.engine

    async def _wait_loaded(self) -> None:
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

    def _unavailable(self, message: str) -> OpenAIError:
        return OpenAIError(503, message, code="model_not_ready",
                           headers={"Retry-After": str(self.retry_after)})

    def acquire(self, num_sequences: int = 1) -> Ticket:
        """Count ``num_sequences`` sequences in flight (a request's prompts times its ``n``)
        until the ticket is released; 429 with ``Retry-After`` when the waiting queue is full.

        The engine runs ``max_num_seqs`` sequences at once, so sequences beyond that wait: the
        queue is full when ``in_flight + new - max_num_seqs`` would exceed ``max_queue``.
        """
        if self.max_queue is not None:
            capacity = self.max_num_seqs + self.max_queue
            if num_sequences > capacity:  # never admitted, however long the client waits
                raise OpenAIError(
                    400, f"The request asks for {num_sequences} sequences (prompts times n); "
                    f"this server admits at most {capacity} at once (max_num_seqs "
                    f"{self.max_num_seqs} + max_queue {self.max_queue}).", param="n")
            waiting_after = self.in_flight + num_sequences - self.max_num_seqs
            if waiting_after > self.max_queue:
                raise OpenAIError(
                    429,
                    f"The server is busy: {max(self.in_flight - self.max_num_seqs, 0)} "
                    f"sequences are waiting and this request adds {num_sequences} "
                    f"(max_queue={self.max_queue}); retry later.",
                    code="queue_full",
                    headers={"Retry-After": str(self.retry_after)},
                )
        self.in_flight += num_sequences
        self.last_activity = time.monotonic()
        return Ticket(self, num_sequences)


class Ticket:
    """Admission of some engine requests; ``release()`` is idempotent."""

    def __init__(self, holder: EngineHolder, count: int) -> None:
        self._holder = holder
        self._count = count

    def release(self) -> None:
        self._holder.in_flight -= self._count
        if self._count:
            self._holder.last_activity = time.monotonic()
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
