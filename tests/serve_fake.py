"""A stand-in for minfer_core.batch_engine with the agreed interface, used only until the real
batched engine lands. Tokens come from a fixed cycle; KV blocks are counted, not allocated."""

from __future__ import annotations

import sys
import threading
import time
import types
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from minfer_core.errors import UserError
from minfer_core.gguf_file import open_gguf
from minfer_core.tokenizer import StreamDecoder, Tokenizer


class QueueFull(Exception):
    pass


@dataclass
class Request:
    prompt_ids: list
    max_tokens: int
    sampling: object
    stop: list = ()
    ignore_eos: bool = False
    on_event: Callable | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class Event:
    request_id: str
    text: str
    token_ids: list
    finished: bool
    finish_reason: str | None
    error: str | None
    prompt_tokens: int
    completion_tokens: int


class _Seq:
    def __init__(self, req, tok):
        self.req, self.n, self.dec, self.pending, self.blocks = req, 0, StreamDecoder(tok), "", 0


class BatchEngine:
    CYCLE = [ord(c) - 33 for c in "hello"] + [256]  # byte tokens of the tiny vocab, then "Ġt"

    def __init__(self, tok, n_ctx, parallel, max_queue, block_size, step_s):
        self.tok, self.n_ctx, self.parallel, self.max_queue, self.block_size = tok, n_ctx, parallel, max_queue, block_size
        self.step_s = step_s
        self.total = parallel * ((n_ctx + block_size - 1) // block_size)
        self.free = self.total
        self.queue: deque = deque()
        self.running: dict[str, _Seq] = {}
        self.cancelled: set[str] = set()
        self.lock = threading.Lock()
        self.gen_total = self.prompt_total = 0

    @classmethod
    def load(cls, path, *, n_ctx, parallel, max_queue, gpu_memory=None, block_size=16, step_s=0.002, **kw):
        return cls(Tokenizer.from_metadata(open_gguf(path).metadata), n_ctx, parallel, max_queue, block_size, step_s)

    def submit(self, req):
        if len(req.prompt_ids) >= self.n_ctx:
            raise UserError(f"prompt is {len(req.prompt_ids)} tokens, context is {self.n_ctx}")
        with self.lock:
            if len(self.queue) >= self.max_queue:
                raise QueueFull()
            self.queue.append(req)
        return req.id

    def cancel(self, rid):
        with self.lock:
            self.cancelled.add(rid)

    def _emit(self, s, text, ids, reason=None):
        s.req.on_event(Event(s.req.id, text, ids, reason is not None, reason, None, len(s.req.prompt_ids), s.n))

    def step(self):
        with self.lock:
            cancelled, self.cancelled = self.cancelled, set()
            for r in [r for r in self.queue if r.id in cancelled]:
                self.queue.remove(r)
                self._emit(_Seq(r, self.tok), "", [], "cancelled")
            while self.queue and len(self.running) < self.parallel:
                r = self.queue.popleft()
                s = self.running[r.id] = _Seq(r, self.tok)
                s.blocks = self.total // self.parallel
                self.free -= s.blocks
                self.prompt_total += len(r.prompt_ids)
        for rid, s in list(self.running.items()):
            reason, text, ids = None, "", []
            if rid in cancelled:
                reason = "cancelled"
            else:
                t = self.CYCLE[s.n % len(self.CYCLE)]
                s.n += 1
                self.gen_total += 1
                ids = [t]
                s.pending += s.dec.push(t)
                hit = min((s.pending.find(x) for x in s.req.stop if x in s.pending), default=-1)
                if hit >= 0:
                    text, reason = s.pending[:hit], "stop"
                else:
                    text, s.pending = s.pending, ""
                    if 0 <= s.req.max_tokens <= s.n:
                        reason = "length"
                    elif len(s.req.prompt_ids) + s.n >= self.n_ctx:
                        reason = "context"
            if reason:
                with self.lock:
                    del self.running[rid]
                    self.free += s.blocks
            self._emit(s, text, ids, reason)
        time.sleep(self.step_s)
        return bool(self.running or self.queue)

    def run_forever(self, stop_event):
        while not stop_event.is_set():
            if not self.step():
                time.sleep(0.002)

    def stats(self):
        return {"queue_depth": len(self.queue), "running": len(self.running), "kv_blocks_used": self.total - self.free,
                "kv_blocks_free": self.free, "kv_blocks_total": self.total, "tokens_generated_total": self.gen_total,
                "prompt_tokens_total": self.prompt_total}

    def memory_plan(self):
        return f"fake engine: {self.total} KV blocks of {self.block_size} tokens"


def install():
    """Make ``minfer_core.batch_engine`` this module when the real one is absent."""
    try:
        import minfer_core.batch_engine  # noqa: F401
    except ImportError:
        mod = types.ModuleType("minfer_core.batch_engine")
        mod.__dict__.update(QueueFull=QueueFull, Request=Request, Event=Event, BatchEngine=BatchEngine)
        sys.modules["minfer_core.batch_engine"] = mod
