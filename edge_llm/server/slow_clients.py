"""A deadline for a request's headers, on uvicorn's own HTTP protocol.

uvicorn bounds idle kept-alive connections (``timeout_keep_alive``) but not a client that
sends its headers a byte at a time: such a connection is held forever, and enough of them use
up the process's file descriptors. The protocol below closes a connection whose next request's
headers have not all arrived ``seconds`` after it opened or after its last response ended.
(The body's deadline is an ASGI matter: ``guard.py``.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

logger = logging.getLogger("edge_llm.server")


def header_deadline_protocol(seconds: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (httptools or h11, as uvicorn picks) with the deadline."""
    base: Any = AutoHTTPProtocol

    class HeaderDeadlineProtocol(base):
        _deadline: asyncio.TimerHandle | None = None
        _cycle_at_arm: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._cycle_at_arm = self.cycle  # a new request's headers make a new cycle
            self._deadline = self.loop.call_later(seconds, self._expire)

        def _expire(self) -> None:
            self._deadline = None
            cycle = self.cycle
            waiting = cycle is None or cycle.response_complete  # no request under way
            if cycle is self._cycle_at_arm and waiting and not self.transport.is_closing():
                logger.info("Closed a connection from %s: no complete request headers "
                            "within %g s", self.client, seconds)
                self.transport.close()

    return HeaderDeadlineProtocol
