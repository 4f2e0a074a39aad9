"""Running the app under uvicorn with a draining shutdown.

On SIGTERM or SIGINT the server keeps listening but answers new generation requests with 503,
lets in-flight requests finish for up to ``shutdown_timeout`` seconds, cancels what is left (each
such request ends with an error event), then lets uvicorn close and exits normally. A second
SIGINT forces an immediate exit.
"""

from __future__ import annotations

import asyncio
import logging
import signal

import uvicorn

from .runner import EngineRunner

log = logging.getLogger("minfer.serve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runner: EngineRunner, shutdown_timeout: float):
        super().__init__(config)
        self.runner, self.shutdown_timeout = runner, shutdown_timeout
        self._drain_task: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame) -> None:
        # Unlike uvicorn's handler this does not re-raise the signal after shutdown: a drained
        # server exits with status 0.
        if self.runner.draining:
            if sig == signal.SIGINT:
                self.force_exit = self.should_exit = True
            return
        log.info("minfer: %s: draining (%d in flight, deadline %g s)", signal.Signals(sig).name,
                 self.runner.inflight, self.shutdown_timeout)
        self.begin_drain()

    def begin_drain(self) -> None:
        """Stop admitting and schedule the drain on the event loop (safe from a signal handler)."""
        self.runner.draining = True
        loop = self.runner.loop
        if loop is None or not loop.is_running():
            self.should_exit = True
            return
        loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        try:
            await self.runner.drain(self.shutdown_timeout)
            await asyncio.sleep(0.2)  # let the last responses reach their sockets
        finally:
            self.should_exit = True


# Idle keep-alive connections are closed after this long. It must exceed the clients' own idle
# expiry (httpx, hence the openai client: 5 s; aiohttp: 15 s), else a client may send a request on a
# connection the server is closing at that moment and see a reset.
KEEP_ALIVE_S = 75


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                          timeout_keep_alive=KEEP_ALIVE_S, access_log=log_level == "debug", lifespan="on")


def serve(app, runner: EngineRunner, host: str, port: int, shutdown_timeout: float, log_level: str = "info",
          sockets=None) -> None:
    """Serve until a signal; returns after the drain and uvicorn's shutdown."""
    DrainingServer(uvicorn_config(app, host, port, log_level), runner, shutdown_timeout).run(sockets=sockets)
