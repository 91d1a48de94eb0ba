"""Engine requests seen from the server: metrics per output, errors as OpenAI errors, abort on
early exit, and several requests (a completions batch) merged into one stream.

Whoever stops iterating early (a client that went away, an error in a sibling request) gets its
engine requests aborted, so their KV blocks are free before the engine's next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import anyio

from edge_llm.outputs import RequestOutput
from edge_llm.sampling_params import SamplingParams

from .engine_api import ServingEngine
from .errors import OpenAIError, bad_request, param_from_value_error
from .metrics import RequestTracker
from .preprocess import SAMPLING_FIELDS

logger = logging.getLogger("edge_llm.server")


async def generate_one(
    engine: ServingEngine, prompt_ids: list[int], params: SamplingParams, request_id: str,
    tracker: RequestTracker, prompt_param: str = "prompt",
) -> AsyncIterator[RequestOutput]:
    """The engine's outputs for one request; a ValueError from the engine becomes a 400."""
    stream = engine.generate(prompt_ids, params, request_id)
    finished = False
    try:
        async for out in stream:
            tracker.observe(out)
            finished = out.finished
            yield out
    except ValueError as exc:  # raised before the first output: the request was refused
        finished = True
        param = param_from_value_error(str(exc), SAMPLING_FIELDS) or prompt_param
        raise bad_request(str(exc), param) from exc
    except OpenAIError:
        raise
    except Exception as exc:  # noqa: BLE001 - EngineError and anything else: a 500 for this one
        finished = True  # a failed step already dropped the request
        if not getattr(exc, "logged", False):  # the engine loop logs a failed step itself
            logger.error("The engine failed on request %s", request_id, exc_info=exc)
        raise OpenAIError(500, f"The engine failed on this request: {exc}",
                          code="engine_error", logged=True) from exc
    finally:
        # runs during cancellation too (a disconnect): shield the awaits from it
        with anyio.CancelScope(shield=True):
            await stream.aclose()
            if not finished:
                tracker.aborted()
                await engine.abort(request_id)


async def merged(streams: list[AsyncIterator[RequestOutput]]
                 ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several streams as ``(stream index, output)`` in arrival order.

    The first error of any stream is raised here; leaving early (or an error) cancels the
    other streams, whose ``finally`` aborts their engine requests.
    """
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((i, exc))
        else:
            queue.put_nowait((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


async def collect(streams: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """The final output of each stream (non-streaming responses)."""
    finals: list[RequestOutput | None] = [None] * len(streams)
    async for i, out in merged(streams):
        finals[i] = out
    missing = [i for i, f in enumerate(finals) if f is None]
    if missing:
        raise OpenAIError(500, f"The engine returned no output for prompt {missing[0]}.")
    return finals  # type: ignore[return-value]
