"""The engine thread and its bridge to asyncio.

One thread runs ``BatchEngine.run_forever``; requests are submitted from the event loop and their
events come back, from the engine thread, through ``loop.call_soon_threadsafe`` into one
``asyncio.Queue`` per request. The runner keeps the set of accepted requests so that none is lost:
each ends with exactly one final event, from the engine or, should the engine thread die, from the
runner itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from ..batch_engine import Event, QueueFull, Request
from ..errors import UserError

log = logging.getLogger("minfer.serve")


@dataclass
class Stream:
    """One accepted request as the event loop sees it."""

    id: str
    queue: asyncio.Queue
    submitted: float = field(default_factory=time.perf_counter)


def new_request_id() -> str:
    return uuid.uuid4().hex


class EngineRunner:
    def __init__(self, engine):
        self.engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.active: dict[str, Stream] = {}
        self.finished: Counter[str] = Counter()  # final events by finish reason
        self.draining = False  # set on shutdown: new requests get 503
        self.failed: str | None = None  # why the engine thread died, if it did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards active between the loop and the engine thread

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._thread = threading.Thread(target=self._run, name="minfer-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.engine.run_forever(self._stop)
        except BaseException as e:  # noqa: BLE001 - the thread must not die silently
            self.failed = f"engine stopped: {type(e).__name__}: {e}"
            log.exception("minfer: engine thread failed")
            self._fail_all(self.failed)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all("server stopped")

    @property
    def inflight(self) -> int:
        return len(self.active)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failed is None

    # -- requests ------------------------------------------------------------------------------
    def submit(self, req: Request) -> Stream:
        """Hand ``req`` to the engine; raises QueueFull or UserError (prompt too long)."""
        queue: asyncio.Queue = asyncio.Queue()
        loop = self.loop

        def on_event(ev: Event) -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, ev)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass
            if ev.finished:
                with self._lock:  # counted once, even if _fail_all got there first
                    if self.active.pop(ev.request_id, None) is not None:
                        self.finished[ev.finish_reason or "none"] += 1

        req.on_event = on_event
        req.id = rid = new_request_id()
        stream = Stream(rid, queue)
        with self._lock:  # registered first: the final event may come before submit returns
            self.active[rid] = stream
        try:
            self.engine.submit(req)
        except BaseException:
            with self._lock:
                self.active.pop(rid, None)
            raise
        return stream

    def cancel(self, rid: str) -> None:
        if rid in self.active:
            self.engine.cancel(rid)

    def cancel_all(self) -> None:
        for rid in list(self.active):
            self.engine.cancel(rid)

    async def drain(self, deadline_s: float) -> None:
        """Wait up to ``deadline_s`` for in-flight requests to finish, then cancel the rest and wait
        (bounded) for their final events."""
        t_end = time.monotonic() + max(0.0, deadline_s)
        while self.active and time.monotonic() < t_end:
            await asyncio.sleep(0.05)
        if self.active:
            log.warning("minfer: shutdown deadline reached; cancelling %d request(s)", len(self.active))
            self.cancel_all()
            t_end = time.monotonic() + 5.0
            while self.active and time.monotonic() < t_end and self.alive:
                await asyncio.sleep(0.02)
        if self.active:
            self._fail_all("server stopped before the request finished")

    def _fail_all(self, message: str) -> None:
        """End every request still open with an error event (the engine can no longer do it)."""
        with self._lock:
            left, self.active = list(self.active.values()), {}
            self.finished["error"] += len(left)
        for s in left:
            ev = Event(request_id=s.id, text="", token_ids=[], finished=True, finish_reason="error",
                       error=message, prompt_tokens=0, completion_tokens=0)
            try:
                self.loop.call_soon_threadsafe(s.queue.put_nowait, ev)
            except RuntimeError:
                pass


__all__ = ["EngineRunner", "Stream", "QueueFull", "UserError", "Request", "Event"]
