"""Server-Sent Events framed as OpenAI frames them: ``data: {json}`` events, then ``[DONE]``.

An error after the response started (headers are gone) is sent as one ``data: {"error": ...}``
event, then ``[DONE]``, as vLLM does.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

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


def sse_response(events: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> Stream:
    """A ``text/event-stream`` response; the events generator is closed after the response is
    sent or the client left (Litestar then stops iterating without closing it)."""
    return Stream(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        background=BackgroundTask(_aclose, events),
    )


async def prime(stream: AsyncIterator[T]) -> AsyncIterator[T]:
    """Wait for the first item before returning, so errors raised before it (a refused prompt,
    a failed step) still become an HTTP status; returns a stream with that item back in front."""
    first = await stream.__anext__()  # StopAsyncIteration: an empty stream is a bug upstream

    async def chained() -> AsyncIterator[T]:
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await _aclose(stream)

    return chained()
