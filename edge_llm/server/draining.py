"""uvicorn's server with the admission gate: the graceful shutdown that SIGTERM starts.

uvicorn closes the listening socket (new connections are refused) and waits for open
connections up to ``timeout_graceful_shutdown`` (``--drain-timeout``); the holder's gate makes
requests on kept-alive connections get 503 meanwhile. A SIGTERM ends with exit code 0: uvicorn
would re-raise the signal after the drain, and a platform would read that as a crash.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import uvicorn

logger = logging.getLogger("edge_llm.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, holder: Any) -> None:
        super().__init__(config)
        self.holder = holder  # an EngineHolder: begin_drain() closes admission

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
