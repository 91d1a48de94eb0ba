"""uvicorn's server with the admission gate: the graceful shutdown that SIGTERM starts.

uvicorn closes the listening socket (new connections are refused) and waits for open
connections; the holder's gate makes requests on kept-alive connections get 503 meanwhile.
After ``drain_timeout`` seconds (``--drain-timeout``) the requests still running are ended by
the server itself: each stream gets an error event and ``data: [DONE]``, each waiting response
a 503, and one line is logged. uvicorn's own limit (``timeout_graceful_shutdown``, which
cancels the tasks and leaves a traceback per stream) is set ``CUT_GRACE_S`` later, as a last
resort. A SIGTERM ends with exit code 0: uvicorn would re-raise the signal after the drain,
and a platform would read that as a crash.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import uvicorn

from .lifecycle import EngineHolder

logger = logging.getLogger("edge_llm.server")

CUT_GRACE_S = 5.0  # seconds the ended streams get to send their last events


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, holder: EngineHolder, drain_timeout: float) -> None:
        config.timeout_graceful_shutdown = int(drain_timeout + CUT_GRACE_S + 1)
        super().__init__(config)
        self.holder = holder  # an EngineHolder: begin_drain() closes admission
        self.drain_timeout = drain_timeout

    async def startup(self, sockets: Any = None) -> None:
        """uvicorn's start-up; its "Application startup complete" means the port is open, not
        that the model answers: while it loads, say so plainly."""
        await super().startup(sockets=sockets)
        if self.started and self.holder.state in ("loading", "warming"):
            logger.info("Listening, NOT READY yet: the model is loading (GET /health answers "
                        "503 and requests wait until the line 'READY' below)")

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.holder.begin_drain()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and sig in self._captured_signals:
            self._captured_signals.remove(sig)

    async def _wait_tasks_to_complete(self) -> None:
        try:
            await asyncio.wait_for(super()._wait_tasks_to_complete(), self.drain_timeout)
            return
        except asyncio.TimeoutError:
            pass
        ended = self.holder.interrupt_requests(self.drain_timeout)
        logger.warning("Drain timeout (%g s): ended %d unfinished requests with an error",
                       self.drain_timeout, ended)
        await super()._wait_tasks_to_complete()
