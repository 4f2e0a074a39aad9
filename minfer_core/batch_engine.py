"""Serving many requests at once: a paged KV pool, a continuous-batching scheduler, and the
batched forward, behind a thread-safe submit / cancel / step interface.

One thread runs :meth:`BatchEngine.run_forever` (or calls :meth:`step`); any thread may call
:meth:`submit`, :meth:`cancel` and :meth:`stats`. Each accepted request gets its events in order
through ``on_event`` (called from the engine thread), the last one with ``finished=True``.
A request's greedy tokens do not depend on what else runs (see :mod:`minfer_core.batch_forward`
and :mod:`minfer_core.scheduler`); sampled tokens come from the request's own seed (drawn on the
device, :mod:`minfer_core.device_sampler`, or by its host sampler), so they do not either.

A step whose every sequence has one row (decode-only) runs from fixed shapes (entries padded to a
bucket of 1..256 on a scratch block, :mod:`minfer_core.batch_inputs`), through the wrapper of the
plugin the policy's ``batch_step`` order ranks first (hook ``minfer_wrap_batch_step``; cuda_graphs
replays a CUDA graph per bucket on a GPU); other steps run eagerly. Both give a row the same bits.
Plain-greedy requests take one argmax over the step's rows; with ``device_sampling`` (on a GPU) the
sampled ones are drawn on the device; the others' logits come to the host in one copy for their own
samplers. While every running request decodes greedily and nothing waits, decode-only steps
overlap: each is launched before the last is read back (``overlap``).
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Sequence as Seq

import torch

from .batch_forward import batch_step, decode_rows
from .batch_inputs import StepPacker, upload
from .device_sampler import row_key, sample_rows
from .dispatch import wrap_step
from .engine import Engine, StopStream, log, prompt_bucket
from .errors import UserError
from .greedy_chain import GreedyChain
from .kv_pages import BlockPool
from .matmuls import PREFILL_ROWS, BatchMatmuls, DecodeMatmuls, TiledPromptMatmuls
from .sampling import Sampler, SamplerConfig
from .scheduler import Scheduler, Sequence, Work

#: Engines serving at most this many sequences at once use the plan's row-invariant kernels. The
#: 7B's q4_K rows GEMM beats the fused 16-row tiles at 8 rows (gate|up ~48 us against 75.4, down 30.6
#: vs 42.2) but not at 16, where it runs two 8-row groups (the four q4_K weights of a layer 153.5 us
#: against 147.6, each figure from one call), nor at 32 (gate|up ~120 vs 78.4) (H200,
#: benchmarks/README.md).
ROWS_MAX_PARALLEL = 8
#: Row tiles on a GPU by engine size: (at most this many sequences, tile rows); they carry the rows at
#: generated positions (prompt rows take GPU_PROMPT_TILE). H200, 7B, each pair in one call: B=8 S_TG
#: 1,453 with 16-row tiles vs 1,279 with 64; B=32 3,381 with 32 vs 3,309 with 64 (not taken then for
#: its S_PP, measured when prompt rows still ran in these tiles); B=128 8,100 with one 128-row tile vs
#: 5,896 with two of 64. mmq_triton's q4_K / q6_K kernels of few rows (on Hopper the warpgroup-MMA
#: GEMM, else the fused GEMM) take less time at 32 rows than at 64 (us a call, warpgroup-MMA 32 vs
#: 64 rows: gate|up 54.5 vs 81.5, down 34.1 vs 40.5, q6_K down 40.6 vs 46.3, the output head 250.0
#: vs 350.4), hence the 32-row bucket. An engine of one sequence decodes on the decode kernels, so
#: its tiles only carry rows recomputed after a preemption. Tiles under 64 rows only when every
#: tiled weight's kernel says ``small_tiles`` (one that expands its weight per call, e.g. the 0.5B's
#: q5_0, would do that 4x as often).
GPU_ROW_TILES = ((1, 64), (16, 16), (32, 32), (64, 64), (None, 128))
#: Tile of a step's prompt rows on a GPU (TiledPromptMatmuls): each weight is expanded once a step
#: and cuBLAS multiplies the tiles; 256-row tiles are where a bf16 GEMM stops being bound by reading
#: the expanded weight (7B: ~13 GB of bf16 a tile). On the CPU: 16 (small test shapes).
GPU_PROMPT_TILE = 256

_ids = itertools.count()


def check_row_tile(n: int, name: str = "row tile") -> None:
    """Raise UserError for a row tile under PREFILL_ROWS rows: each of its matmuls would run the
    weight's one-row decode kernel, once a row."""
    if n < PREFILL_ROWS:
        raise UserError(f"{name} {n}: a row tile holds at least {PREFILL_ROWS} rows")


class QueueFull(Exception):
    """The request queue is full (or the engine is draining): retry later (the server answers 429,
    or 503 once it drains)."""


@dataclass
class Event:
    """New output of one request; exactly one event per accepted request has ``finished=True``."""

    request_id: str
    text: str  # new text since the last event ('' allowed)
    token_ids: list[int]
    finished: bool = False
    finish_reason: Optional[str] = None  # "stop" | "length" | "eog" | "context" | "cancelled" | "error"
    error: Optional[str] = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int = -1  # -1: until the context is full
    sampling: SamplerConfig = field(default_factory=SamplerConfig)
    stop: Seq[str] = ()  # stop strings (not emitted)
    ignore_eos: bool = False
    on_event: Optional[Callable[[Event], None]] = None  # called from the engine thread
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    sampler: Optional[Sampler] = None  # a sampler to continue (a chat's, across turns); default: a new one


class _Live:
    """What the engine keeps per request: its sampler, its text stream, its output so far."""

    def __init__(self, req: Request, tok):
        self.req = req
        self.sampler = req.sampler or Sampler(req.sampling)
        self.greedy = req.sampling.greedy and req.sampling.repeat_penalty == 1.0  # plain argmax
        # sampled, no penalty: drawable on the device (device_sampler)
        self.device_draw = not req.sampling.greedy and req.sampling.repeat_penalty == 1.0
        self.text = StopStream(tok, req.stop)
        self.out: list[int] = []
        self.finished = False  # its last event is out (a step in flight may still hold a row of it)


#: Stands in ``Sequence.tokens`` for a token an overlapped step is still computing.
PENDING = -1


@dataclass
class _Flight:
    """A decode-only step launched but not yet read back: its works, their greedy tokens on the
    device (what the next step reads), and the host copy (valid once ``ready`` has passed)."""

    work: list[Work]
    tokens: torch.Tensor
    host: torch.Tensor
    ready: Optional[torch.cuda.Event]
    row: dict[str, int]  # sequence id -> its row in ``tokens``


class BatchEngine:
    def __init__(self, engine: Engine, *, parallel: int, max_queue: int, n_blocks: int, block_size: int = 16,
                 segment: int = 64, step_tokens: int = 512, row_tile: Optional[int] = None,
                 graphs: Optional[bool] = None, rows: Optional[bool] = None, overlap: bool = True,
                 prompt_tile: Optional[int] = None, device_sampling: Optional[bool] = None, solo: bool = False):
        if solo and parallel != 1:
            raise ValueError("a solo engine runs one sequence at a time (parallel=1)")
        self.engine, self.model = engine, engine.model
        # one sequence at a time on the single-stream passes while its blocks are 0, 1, 2, ... (the
        # CLI's engine): the bits and speed of Engine.generate; every full block of a finished
        # sequence stays findable, so a chat's next turn reuses what the last one computed
        self.solo = solo
        self.overlap = overlap  # launch the next greedy decode-only step before reading this one back
        # sampled requests without a repeat penalty drawn on the device (default: on a GPU)
        self.device_sampling = (device_sampling if device_sampling is not None
                                else self.model.device.type == "cuda" and not solo)
        self._flight: Optional[_Flight] = None
        self._chain: Optional[GreedyChain] = None  # a solo engine's overlapped greedy steps
        self._copies: Optional[torch.cuda.Stream] = None  # the stream greedy tokens go to the host on
        # the greedy pick (hook minfer_argmax_candidates: a plugin's kernel on a GPU)
        self._argmax = self.model.rt.plan.decode_ops["argmax"].fn
        # the plan's row-invariant kernels (plan.batch), or row tiles for every weight: fixed for the
        # engine's life (a request's bits must not depend on the batch)
        self.rows = rows if rows is not None else parallel <= ROWS_MAX_PARALLEL
        self.tok, self.cfg, self.n_ctx = engine.tok, engine.cfg, engine.model.n_ctx
        self.block_size, self.max_queue = block_size, max_queue
        self.row_tile = row_tile or (self._gpu_row_tile(parallel) if self.model.device.type == "cuda" else 16)
        check_row_tile(self.row_tile)
        self.step_mm = BatchMatmuls(self.model.rt, self.row_tile, self.rows)
        self.prompt_tile = prompt_tile or (GPU_PROMPT_TILE if self.model.device.type == "cuda" else 16)
        self.prompt_mm = TiledPromptMatmuls(self.model.rt, self.prompt_tile)
        # one sequence at a time (never batched with another): its decode steps run the single-stream
        # decode kernels
        self.decode_mm = DecodeMatmuls(self.model.rt) if parallel == 1 else self.step_mm
        attn = self.model.rt.attn_paged
        if attn is None:
            raise UserError("the plan has no paged_decode attention: the batched engine needs one")
        # the plan's paged attention, or what it offers for an engine of this size (fixed for its life)
        for_engine = getattr(attn.fn, "for_engine", None)
        self.attn = replace(attn, fn=for_engine(parallel)) if for_engine else attn
        # one block past the pool's: the scratch block that padding entries write and read
        self.model.resize_cache((n_blocks + 1) * block_size)
        engine.rewrap()  # the single-stream passes' graphs (if any) held the old cache
        self.packer = StepPacker(block_size, scratch=n_blocks, max_blocks=-(-self.n_ctx // block_size))
        # the decode-only step as a plugin wraps it (None: eager; off with graphs=False or -p no:cuda_graphs)
        self.batch_step: Optional[Callable] = None
        if graphs is not False and engine.pm is not None:
            padding = torch.from_numpy(self.packer.padding).to(self.model.device)
            self.batch_step = wrap_step("batch_step", self._decode_step, engine.ctx, engine.pm, engine.plan,
                                        padding=padding)
        self.pool = BlockPool(n_blocks, block_size, lowest_first=solo)
        self.solo_fallbacks = 0  # solo steps that ran on the batched path (blocks not 0, 1, 2, ...)
        self.sched = Scheduler(self.pool, parallel=parallel, segment=block_size if solo else segment,
                               step_tokens=step_tokens, share_all=solo)
        self._lock = threading.Lock()  # guards _incoming, _cancels, _draining and the counters
        self._step_lock = threading.Lock()  # one step at a time
        self._wake = threading.Event()
        self._incoming: list[Sequence] = []
        self._cancels: set[str] = set()
        self._draining = False
        self._order = itertools.count()
        self._n_open = 0  # requests accepted and not yet finished
        self.tokens_generated_total = 0
        self.prompt_tokens_total = 0

    def _gpu_row_tile(self, parallel: int) -> int:
        """The engine's row tile on a GPU: by ``parallel`` (GPU_ROW_TILES), under 64 rows only if the
        kernels of every weight that runs over tiles say ``small_tiles``."""
        plan = self.model.rt.plan
        small = all(c.small_tiles for n, c in plan.prefill.items() if not (self.rows and n in plan.batch))
        return next(t for top, t in GPU_ROW_TILES if (top is None or parallel <= top) and (small or t >= 64))

    @classmethod
    def load(cls, path, *, n_ctx: int, parallel: int, max_queue: int, gpu_memory: Optional[float] = None,
             block_size: int = 16, kv_blocks: Optional[int] = None, segment: int = 64, step_tokens: int = 512,
             row_tile: Optional[int] = None, graphs: Optional[bool] = None, rows: Optional[bool] = None,
             prompt_tile: Optional[int] = None, solo: Optional[bool] = None,
             **engine_load_kwargs) -> "BatchEngine":
        """Load the model and size the KV pool: ``kv_blocks`` blocks, else on a GPU what fits in
        ``gpu_memory`` (a fraction of the device's memory when <= 1, else GiB; default 0.9) after
        the weights, at most enough for ``parallel`` full contexts; on the CPU ``parallel`` full
        contexts.

        ``rows`` (default: ``parallel`` <= ROWS_MAX_PARALLEL): weights with a row-invariant kernel
        (``plan.batch``, e.g. mmq_triton's q4_K rows GEMM) multiply all of a step's rows at once;
        other weights, and every weight with ``rows=False``, run over tiles of ``row_tile`` rows
        (default on a GPU by ``parallel``, ``GPU_ROW_TILES``; 16 on the CPU), padded: either way a
        request's bits are independent of the batch. Both are fixed for the engine's life. Larger
        tiles read each weight fewer times in big steps (a step of B rows runs every matmul
        ceil(B / tile) times); smaller ones waste less on small steps. Those are the rows at
        generated positions; rows at prompt positions run over tiles of ``prompt_tile`` rows
        (default ``GPU_PROMPT_TILE`` on a GPU, 16 on the CPU), each weight expanded once a step.
        ``graphs``: ``False`` runs every step eagerly; otherwise decode-only steps go through the
        plugin the policy's ``batch_step`` order ranks first (cuda_graphs: CUDA graphs per bucket of
        1..256 sequences, on a GPU unless the plugin is off). ``solo`` (default: ``parallel`` == 1):
        one sequence at a time on the single-stream passes (see ``__init__``)."""
        if parallel < 1 or max_queue < 0:
            raise UserError("--parallel must be at least 1 and the queue size at least 0")
        engine = Engine.load(path, n_ctx=n_ctx, **engine_load_kwargs)
        per_ctx = -(-engine.model.n_ctx // block_size)
        if kv_blocks is None:
            kv_blocks = parallel * per_ctx
            if engine.device.type == "cuda":
                kv_blocks = min(kv_blocks, _blocks_in_memory(engine, gpu_memory, block_size, step_tokens))
        if kv_blocks < per_ctx:
            raise UserError(f"the KV pool holds {kv_blocks * block_size} tokens, less than one context of "
                            f"{engine.model.n_ctx}: lower -c or raise --gpu-memory")
        return cls(engine, parallel=parallel, max_queue=max_queue, n_blocks=kv_blocks, block_size=block_size,
                   segment=segment, step_tokens=step_tokens, row_tile=row_tile, graphs=graphs, rows=rows,
                   prompt_tile=prompt_tile, solo=parallel == 1 if solo is None else solo)

    # -- the server's side ---------------------------------------------------------------------
    def submit(self, req: Request) -> str:
        """Queue a request; its id. Raises QueueFull (``max_queue`` requests would wait beyond the
        ``parallel`` slots), or UserError for a prompt that cannot run."""
        n = len(req.prompt_ids)
        self.engine.check_ids(req.prompt_ids)
        if n >= self.n_ctx:
            raise UserError(f"the prompt is {n} tokens, the context is {self.n_ctx}: shorten it or raise -c")
        seq = Sequence(req.id, list(req.prompt_ids), n, order=next(self._order), data=_Live(req, self.tok))
        with self._lock:
            if self._draining:
                raise QueueFull("the server is shutting down")
            if self._n_open >= self.sched.parallel + self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting)")
            self._incoming.append(seq)
            self._n_open += 1
        self._wake.set()
        return req.id

    def cancel(self, request_id: str) -> None:
        """Stop a request; its blocks are freed by the next step at the latest."""
        with self._lock:
            self._cancels.add(request_id)
        self._wake.set()

    def stats(self) -> dict:
        with self._lock:
            running = len(self.sched.running)
            return {"queue_depth": max(0, self._n_open - running), "running": running,
                    "kv_blocks_used": self.pool.n_used, "kv_blocks_free": self.pool.n_free,
                    "kv_blocks_total": self.pool.n_blocks, "tokens_generated_total": self.tokens_generated_total,
                    "prompt_tokens_total": self.prompt_tokens_total, "preemptions": self.sched.preemptions,
                    "prefix_cache_hit_blocks": self.pool.hits}

    def memory_plan(self) -> str:
        """Weights (on a GPU: everything allocated besides the pool, planes included), the pool, and
        how many sequences of what length it holds."""
        m = self.model
        kv = m.cache.k.numel() * m.cache.k.element_size() * 2
        if m.device.type == "cuda":
            weights, what = torch.cuda.memory_allocated(m.device) - kv, "allocated besides the KV pool"
        else:
            weights = sum(w.raw.numel() * w.raw.element_size() for w in m.rt.weights.values() if w.raw is not None)
            what = "GGUF blocks"
        toks = self.pool.n_blocks * self.block_size
        return (f"weights {weights / 2**30:.2f} GiB ({what}) | KV pool {kv / 2**30:.2f} GiB: "
                f"{self.pool.n_blocks} blocks of {self.block_size} tokens = {toks} tokens | fits "
                f"{toks // self.n_ctx} sequences of {self.n_ctx} tokens or {toks // 1024} of 1024 "
                f"(--parallel {self.sched.parallel})")

    def run_forever(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set():
            if not self.step():
                self._wake.wait(0.05)
                self._wake.clear()

    def drain(self, deadline_s: float) -> None:
        """Stop admitting; run what was accepted until ``deadline_s`` seconds from now, then end the
        rest with finish_reason "cancelled"."""
        with self._lock:
            self._draining = True
        end = time.monotonic() + deadline_s
        while time.monotonic() < end and self.step():
            pass
        with self._step_lock:
            if self._flight is not None:
                self._land()
            with self._lock:
                left = self._incoming + list(self.sched.running) + list(self.sched.waiting)
                self._incoming = []
            for seq in left:
                self._finish(seq, "cancelled", error="the server is shutting down")

    # -- the engine thread -----------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduler iteration; False when there was nothing to do."""
        with self._step_lock:
            with self._lock:
                incoming, self._incoming = self._incoming, []
                cancels, self._cancels = self._cancels, set()
            for seq in incoming:
                self.sched.add(seq)
            for rid in cancels:
                seq = self.sched.find(rid)
                if seq is not None:
                    self._finish(seq, "cancelled")
            flight = self._flight
            checked = flight is not None and self._may_overlap()  # every running sequence may overlap
            if flight is not None and not checked:
                self._land()
            work = self.sched.schedule()
            if work:
                self._run(work, checked)
            elif self._flight is not None:
                self._land()
            return bool(work) or bool(incoming) or bool(cancels) or flight is not None

    # -- overlapped decode steps ---------------------------------------------------------------
    # A greedy decode-only step is launched before the previous one is read back: its token
    # column comes from the previous step's argmax on the device, so the host reads back, detokenizes
    # and schedules while the GPU computes. Every row computes what it would have computed in a
    # step of its own (same inputs, same kernels); a sequence that the read-back finishes (end of
    # generation, a stop string) has one row in the step after, which is dropped.
    def _overlappable(self, seq: Sequence) -> bool:
        """Decoding, greedy, and not certain to end by its length or the context when its pending
        token is read back."""
        live: _Live = seq.data
        n_out = len(live.out) + (seq.tokens[-1] == PENDING)
        return (seq.decoding and live.greedy and len(seq.tokens) + 1 < self.n_ctx
                and (live.req.max_tokens < 0 or n_out < live.req.max_tokens))

    def _may_overlap(self) -> bool:
        """Whether the next step may launch with a step in flight: nothing waits to be admitted,
        every running sequence can take a block without a preemption, and every one is overlappable."""
        s = self.sched
        return (not s.waiting and s.pool.n_free >= len(s.running)
                and all(self._overlappable(seq) for seq in s.running))

    def _launch(self, work: list[Work]) -> None:
        """Launch a decode-only step; read back the step in flight (if any) while it runs."""
        dev, prev = self.model.device, self._flight
        packed = self.packer.decode_only(work)
        if prev is not None:  # rows whose input token is in flight: -1 - its row there
            for i, w in enumerate(work):
                if packed[i, 0] == PENDING:
                    packed[i, 0] = -1 - prev.row[w.seq.id]
        host_in = torch.from_numpy(packed)
        inputs = upload(host_in, dev)
        if prev is not None:
            tok = inputs[:, 0]
            inputs[:, 0] = torch.where(tok < 0, prev.tokens[(-1 - tok).clamp(min=0)], tok)
        logits = (self.batch_step or self._decode_step)(inputs)
        self._fly(work, self._greedy_tokens([w.seq for w in work], logits[:len(work)]), prev)

    def _launch_solo(self, w: Work) -> None:
        """A solo engine's decode step on the single-stream pass, launched like :meth:`_launch`, as
        a step of a :class:`GreedyChain` (its pick made on the device; a token still in flight, the
        chain's last pick, is read where it is)."""
        prev, seq = self._flight, w.seq
        token = seq.tokens[w.start]
        if token == PENDING:
            r = prev.row[seq.id]
            token = prev.tokens[r:r + 1]
        if self._chain is None:
            self._chain = GreedyChain(self.engine)
        if not self._chain.holds(token, w.start) and self._copies is not None:  # a restart: after the copies
            torch.cuda.current_stream(self.model.device).wait_stream(self._copies)
        self._fly([w], self._chain(token, w.start), prev)

    def _fly(self, work: list[Work], tokens: torch.Tensor, prev: Optional[_Flight]) -> None:
        """``work``'s step is launched and ``tokens`` (device) are its greedy tokens: start their copy
        to the host, advance the sequences (each next token pending), then read back ``prev``."""
        dev = tokens.device
        ready = None
        if dev.type == "cuda":
            # copied on a stream of its own, so the next step does not wait for the copy's latency;
            # record_stream keeps ``tokens``' memory from reuse until the copy has read it
            if self._copies is None:
                self._copies = torch.cuda.Stream(dev)
            self._copies.wait_stream(torch.cuda.current_stream(dev))
            host = torch.empty(len(work), dtype=tokens.dtype, pin_memory=True)
            with torch.cuda.stream(self._copies):
                host.copy_(tokens, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
            tokens.record_stream(self._copies)
        else:
            host = tokens
        for w in work:
            self.sched.advance(w)
            w.seq.tokens.append(PENDING)
        self._flight = _Flight(work, tokens, host, ready, {w.seq.id: i for i, w in enumerate(work)})
        if prev is not None:
            self._land(prev)

    def _land(self, flight: Optional[_Flight] = None) -> None:
        """Read back a launched step (default: the one in flight) and accept its tokens."""
        if flight is None:
            flight, self._flight = self._flight, None
        if flight.ready is not None:
            flight.ready.synchronize()
        for w, token in zip(flight.work, flight.host.tolist()):
            if not w.seq.data.finished:
                w.seq.tokens[w.end] = token
                self._accept(w.seq, token, placed=True)

    def _run(self, work: list[Work], checked: bool = False) -> None:
        """Run a step's work: launched (overlapped) when it may be, else read back at once.
        ``checked``: step() found every running sequence overlappable (a step is in flight)."""
        if self.solo:
            if len(work) == 1 and work[0].seq.blocks == list(range(len(work[0].seq.blocks))):
                return self._run_solo(work[0], checked)
            self.solo_fallbacks += 1
        # one row per sequence, each at a generated position: a row at a prompt position (a one-token
        # prompt, or a prompt's last token after a prefix hit) takes the prompt matmuls, as it does
        # in a mixed step (its bits must not depend on what else the step holds)
        decode_only = all(w.end - w.start == 1 and w.start >= w.seq.n_prompt for w in work)
        try:
            if decode_only and self.overlap and (checked or all(self._overlappable(w.seq) for w in work)):
                return self._launch(work)
        except Exception as e:
            return self._failed(work, e)
        try:
            dev = self.model.device
            if decode_only:  # one row per sequence
                inputs = torch.from_numpy(self.packer.decode_only(work)).to(dev)
                logits = (self.batch_step or self._decode_step)(inputs)
                sampled = [i for i, w in enumerate(work) if w.end == len(w.seq.tokens)]
                logits = logits[:len(sampled)] if sampled == list(range(len(sampled))) else \
                    logits.index_select(0, self._rows(sampled, logits))
            else:
                batch, sampled = self.packer.mixed(work, dev)
                logits = self.model.forward(batch_step(batch, self.block_size, self.step_mm, self.attn, self.prompt_mm))
            tokens = self._pick([work[i].seq for i in sampled], logits)
        except Exception as e:
            return self._failed(work, e)
        for w in work:
            self.sched.advance(w)
        for i, token in zip(sampled, tokens):
            self._accept(work[i].seq, token)

    def _run_solo(self, w: Work, checked: bool = False) -> None:
        """A solo engine's step on the single-stream passes: its sequence's rows are the contiguous
        cache's (blocks 0, 1, 2, ...), so ``Engine.run_prompt`` and the decode step (a plugin's graph
        of each) read and write them in place. Greedy decode steps are launched overlapped, as the
        batched engine's are (``checked``: see :meth:`_run`)."""
        seq = w.seq
        decode = w.end - w.start == 1 and w.start >= seq.n_prompt
        try:
            if decode and self.overlap and (checked or self._overlappable(seq)):
                return self._launch_solo(w)
        except Exception as e:
            return self._failed([w], e)
        try:
            if decode:
                logits = self.engine.step(*self.engine.inputs(seq.tokens[w.start], w.start))
            else:
                rows = self._padding_rows(seq, w.end) if w.start == 0 and self.engine.prefill_step else None
                logits = self.engine.run_prompt(seq.tokens[w.start:w.end], w.start, rows)
            token = self._pick([seq], logits)[0] if w.end == len(seq.tokens) else None
        except Exception as e:
            return self._failed([w], e)
        self.sched.advance(w)
        if token is not None:
            self._accept(seq, token)

    def _padding_rows(self, seq: Sequence, n: int) -> int:
        """Rows up to which the padded prefill of ``seq``'s first ``n`` tokens may write
        (``Engine.run_prompt``): its blocks and the free blocks after them up to the padded length,
        cached ones nobody uses dropped from the prefix cache first (their rows are overwritten)."""
        pool, b = self.pool, len(seq.blocks)
        end = min(pool.n_blocks, -(-prompt_bucket(n) // self.block_size))
        while b < end and pool.refs[b] == 0:
            pool.drop(b)
            b += 1
        return b * self.block_size

    def _failed(self, work: list[Work], e: Exception) -> None:
        """The step failed: end its requests (after reading back the step in flight), keep serving
        the others."""
        if self.engine.ctx.trace:
            traceback.print_exc()
        if self._flight is not None:
            self._land()
        for w in work:
            if not w.seq.data.finished:
                self._finish(w.seq, "error", error=f"{type(e).__name__}: {e}")

    def _decode_step(self, inputs: torch.Tensor) -> torch.Tensor:
        return decode_rows(self.model, inputs, self.block_size, self.decode_mm, self.attn)

    def _pick(self, seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
        """The next token of each sequence from its row of ``logits``: one argmax over every
        plain-greedy request; with ``device_sampling`` the sampled ones without a repeat penalty
        drawn on the device (``device_sampler``, keyed by the request's seed and draw number);
        the rest, and rows the device leaves to the host, brought to the host at once for their own
        samplers."""
        greedy = [i for i, s in enumerate(seqs) if s.data.greedy]
        other = [i for i, s in enumerate(seqs) if not s.data.greedy]
        out = [0] * len(seqs)
        if greedy:
            sel = logits if len(greedy) == len(seqs) else logits.index_select(0, self._rows(greedy, logits))
            picked = self._greedy_tokens([seqs[i] for i in greedy], sel)
        on_dev = [i for i in other if seqs[i].data.device_draw] if self.device_sampling else []
        if on_dev:
            lives = [seqs[i].data for i in on_dev]
            drawn = sample_rows(logits.index_select(0, self._rows(on_dev, logits)),
                                [lv.req.sampling for lv in lives],
                                [row_key(lv.sampler.seed, len(lv.out)) for lv in lives])
            for i, t in zip(on_dev, drawn):
                out[i] = t
            done = {i for i, t in zip(on_dev, drawn) if t is not None}
            other = [i for i in other if i not in done]
        if other:
            host = logits[other].float().cpu()
            for j, i in enumerate(other):
                out[i] = seqs[i].data.sampler(host[j], seqs[i].tokens)
        if greedy:
            for i, t in zip(greedy, picked.tolist()):
                out[i] = t
        return out

    @staticmethod
    def _rows(rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        """Row indices for ``logits.index_select`` (not a list index: that copy would wait for the step)."""
        return upload(torch.tensor(rows, dtype=torch.long), logits.device)

    def _greedy_tokens(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """The plain-greedy sequences' next tokens (argmax of their rows), on the device."""
        return self._argmax(logits)

    def _accept(self, seq: Sequence, token: int, placed: bool = False) -> None:
        """Take a sequence's next token (``placed``: already in ``seq.tokens``, an overlapped step's)."""
        live: _Live = seq.data
        req = live.req
        if not live.out:  # its first token: the prompt is done
            with self._lock:
                self.prompt_tokens_total += seq.n_prompt
        if token in self.tok.eog_ids and not req.ignore_eos:
            return self._finish(seq, "eog")
        if not placed:
            seq.tokens.append(token)
        live.out.append(token)
        with self._lock:
            self.tokens_generated_total += 1
        text = live.text.push(token)
        reason = ("stop" if live.text.stopped else "length" if 0 <= req.max_tokens <= len(live.out)
                  else "context" if len(seq.tokens) >= self.n_ctx else None)
        if reason:
            return self._finish(seq, reason, text=text, token_ids=[token])
        self._emit(seq, Event(req.id, text, [token]))

    def _finish(self, seq: Sequence, reason: str, text: str = "", token_ids: Seq[int] = (),
                error: Optional[str] = None) -> None:
        live: _Live = seq.data
        if not live.finished:
            with self._lock:
                self._n_open -= 1
        self.sched.remove(seq)
        self.packer.forget(seq)
        live.finished = True
        if reason not in ("cancelled", "error"):
            text += live.text.finish()
            reason = "stop" if live.text.stopped else reason
        self._emit(seq, Event(live.req.id, text, list(token_ids), True, reason, error))

    def _emit(self, seq: Sequence, ev: Event) -> None:
        live: _Live = seq.data
        ev.prompt_tokens, ev.completion_tokens = seq.n_prompt, len(live.out)
        if live.req.on_event is None:
            return
        try:
            live.req.on_event(ev)
        except Exception as e:  # a broken consumer must not stop the engine
            log(f"minfer: on_event of {live.req.id} raised {type(e).__name__}: {e}")


def _blocks_in_memory(engine: Engine, gpu_memory: Optional[float], block_size: int, step_tokens: int) -> int:
    """KV blocks that fit in the GPU memory left after the weights and a reserve for activations."""
    cfg, dev = engine.cfg, engine.device
    total = torch.cuda.get_device_properties(dev).total_memory
    frac = 0.9 if gpu_memory is None else gpu_memory
    budget = frac * total if frac <= 1 else frac * 2**30
    reserve = max(2**30, 24 * step_tokens * (2 * cfg.n_ff + 4 * cfg.n_embd))
    per_block = 2 * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * engine.model.kv_dtype.itemsize
    return max(0, int((budget - torch.cuda.memory_allocated(dev) - reserve) // per_block))
