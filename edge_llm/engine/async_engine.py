"""AsyncEngine: one background loop serving many concurrent requests.

Every engine call (admission, abort, step) runs on one worker thread, in submission order, so
the scheduler is never touched concurrently and the event loop never blocks on the model:

    event loop:  generate() --add--> [worker: add | step | abort | step ...] --outputs--> queues

An abort submitted while a step runs is applied right after it, before the next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from edge_llm.config import EngineConfig
from edge_llm.outputs import RequestOutput
from edge_llm.sampling_params import SamplingParams

from .llm_engine import LLMEngine, PromptInput, StepError
from .tokenizer import apply_chat_template

logger = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """A step failed; the requests of that step are failed with it, the engine goes on."""

    logged = True  # the engine loop logged the step's traceback once


class AsyncEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.model_path = engine.loaded.path  # the checkpoint folder (generation_config.json)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-llm-engine")
        self._queues: dict[str, asyncio.Queue] = {}
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(LLMEngine(config))

    async def start(self) -> None:
        """Start the loop in the running event loop (again, if an earlier loop has closed)."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._loop is loop:
            return
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._run_loop(), name="edge-llm-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run_loop(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self.engine.has_unfinished():
                self._wakeup.clear()
                if self.engine.config.debug_integrity:
                    await self._call(self.engine.check_integrity)
                await self._wakeup.wait()
                continue
            try:
                outputs = await self._call(self.engine.step)
            except StepError as err:
                logger.exception("Engine step failed; failing its %d requests", len(err.ids))
                for rid in err.ids:
                    queue = self._queues.get(rid)
                    if queue is not None:
                        queue.put_nowait(EngineError(f"Engine step failed: {err.cause!r}"))
                outputs = err.outputs  # the step before it, still due (async output processing)
            for out in outputs:
                queue = self._queues.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)
            await asyncio.sleep(0)  # let the server flush streams between steps

    async def generate(
        self, prompt: PromptInput, params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; ValueError before the first for bad input."""
        await self.start()
        queue: asyncio.Queue = asyncio.Queue()
        if request_id in self._queues:
            raise ValueError(f"Request id {request_id!r} is already in use.")
        self._queues[request_id] = queue
        finished = False
        try:
            await self._call(self.engine.add_request, request_id, prompt, params)
            assert self._wakeup is not None
            self._wakeup.set()
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    # a failed step already dropped the request; an interruption did not
                    finished = isinstance(item, EngineError)
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:  # client went away: free its blocks before the next step
                self._executor.submit(self.engine.abort, request_id)

    def interrupt_all(self, make_error: Callable[[], Exception]) -> int:
        """End every running ``generate`` with ``make_error()`` (raised from it, before its next
        output); each request is aborted as the generator closes. Returns how many."""
        for queue in self._queues.values():
            queue.put_nowait(make_error())
        return len(self._queues)

    @property
    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping

    async def sleep(self, level: int = 1) -> None:
        """Free the GPU (see ``LLMEngine.sleep``); ValueError while requests are in flight."""
        await self._call(self.engine.sleep, level)

    async def wake_up(self) -> None:
        await self._call(self.engine.wake_up)

    async def abort(self, request_id: str) -> None:
        await self._call(self.engine.abort, request_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text; ``kwargs``: ``continue_final_message`` and template variables."""
        return apply_chat_template(self.tokenizer, messages, add_generation_prompt, **kwargs)

    @property
    def grammars(self):
        """The engine's ``GrammarCompiler`` (structured outputs are compiled before queueing,
        so a refusal names the request's field)."""
        return self.engine.grammars

    def stats(self) -> dict:
        return self.engine.stats()
