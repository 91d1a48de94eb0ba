"""Server-Sent Events framed as OpenAI frames them: ``data: {json}`` events, then ``[DONE]``.

An error after the response started (headers are gone) is sent as one ``data: {"error": ...}``
event, then ``[DONE]``, as vLLM does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar

from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from .errors import OpenAIError
from .protocol import to_json

logger = logging.getLogger("edge_llm.server")

DONE = b"data: [DONE]\n\n"
T = TypeVar("T")


def frame(obj: Any) -> bytes:
    return b"data: " + to_json(obj) + b"\n\n"


async def sse_events(chunks: AsyncIterator[Any], on_close: Callable[[], None]
                     ) -> AsyncIterator[bytes]:
    """Frame each chunk; errors become an error event; ``on_close`` runs however it ends."""
    try:
        try:
            async for chunk in chunks:
                yield frame(chunk)
        except OpenAIError as err:
            if not err.logged:
                logger.warning("Stream ended by an error: %s", err.message)
            yield frame(err.body())
        except Exception as exc:  # noqa: BLE001 - the stream must end with an event, not a reset
            logger.exception("Stream failed")
            yield frame(OpenAIError(500, f"Internal server error: {exc}").body())
        yield DONE
    finally:
        await _aclose(chunks)
        on_close()


async def _aclose(it: Any) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


def sse_response(events: AsyncIterator[bytes], sources: Sequence[Any],
                 on_done: Callable[[], None]) -> Stream:
    """A ``text/event-stream`` response.

    Litestar stops iterating when the client leaves and never closes the iterator (and it may
    leave it unstarted, so its ``finally`` never runs): a background task, run after the body
    is sent or the client left, closes ``events`` and then each of ``sources`` (the engine
    streams, whose closing aborts unfinished requests) and calls ``on_done``.
    """

    async def cleanup() -> None:
        try:
            for it in (events, *sources):
                await _aclose(it)
        finally:
            on_done()

    return Stream(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(cleanup),
    )


class Primed(Generic[T]):
    """An async iterator with its first item already taken; ``aclose()`` closes the source
    even if iteration never started."""

    def __init__(self, first: T, rest: AsyncIterator[T]) -> None:
        self._first: list[T] = [first]
        self._rest = rest

    def __aiter__(self) -> Primed[T]:
        return self

    async def __anext__(self) -> T:
        if self._first:
            return self._first.pop()
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        self._first.clear()
        await _aclose(self._rest)


async def prime(stream: AsyncIterator[T]) -> Primed[T]:
    """Wait for the first item before answering, so errors raised before it (a refused prompt,
    a failed step) still become an HTTP status rather than an error event."""
    first = await stream.__anext__()  # StopAsyncIteration: an empty stream is a bug upstream
    return Primed(first, stream)
