"""The engine: load a GGUF file through the plugin plan, then prefill and generate.

``Engine.load`` is the only place hooks run. ``Engine.generate`` keeps the KV cache between calls:
a new prompt that starts with the tokens already in the cache only prefills what is new (chat).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch

from .model_config import ModelConfig, config_from_gguf
from .gates import declared_gates
from .dispatch import Plan, build_plan, check_backend, make_context, wrap_decode_step, wrap_step
from .errors import UserError
from .gguf_file import GGUFFile, ModelFileError, open_gguf
from .loader import load_params, weights_from_file
from .model import PREFILL_ROWS, Runtime, Transformer
from .plugins import get_plugin_manager
from .policy import load_policy
from .sampling import Sampler, SamplerConfig
from .tokenizer import StreamDecoder, Tokenizer


def pick_device(name: str | None = None) -> torch.device:
    """``name`` (cpu, cuda, cuda:N) or the GPU when there is one; a device that is not here is a user error."""
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device '{name}' (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{name}' requested but no CUDA GPU is available here")
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"device '{name}' is not supported (cpu, cuda, cuda:N)")
    return dev


def free_memory(dev: torch.device) -> int:
    """Bytes that can still be allocated on ``dev`` (the GPU's free memory, or MemAvailable)."""
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_kv_fits(path, cfg: ModelConfig, n_ctx: int, dev: torch.device, dtype: torch.dtype) -> None:
    """A context whose K/V cache cannot be allocated is the user's to shrink, not an out-of-memory
    crash (a file may claim a context of 2**31 tokens, and ``-c 0`` takes the file's)."""
    need = 2 * cfg.n_layers * n_ctx * cfg.n_kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()
    free = free_memory(dev)
    if need > free:
        raise UserError(f"{path}: a context of {n_ctx} tokens needs {need / 2**30:.1f} GiB of K/V cache, more than "
                        f"the {free / 2**30:.1f} GiB free on {dev}: give a smaller -c")


@dataclass
class Timings:
    load_s: float = 0.0
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0

    def summary(self) -> str:
        pp = self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0
        tg = (self.gen_tokens - 1) / self.gen_s if self.gen_s and self.gen_tokens > 1 else 0.0
        return (f"load {self.load_s:.2f} s | prompt {self.prompt_tokens} tok, {pp:.1f} tok/s | "
                f"gen {self.gen_tokens} tok, {tg:.1f} tok/s")


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""  # "eog", "stop", "length", "context"


def prompt_bucket(n: int) -> int:
    """The padded length a wrapped prefill step runs ``n`` tokens at: ``n`` rounded up to a
    multiple of an eighth of its power of two, or of 16 (whichever is larger). Padding is then at
    most 15 rows or 12.5%, and each octave of prompt lengths has at most 8 shapes."""
    step = max(PREFILL_ROWS, 1 << max(n.bit_length() - 4, 0))
    return -(-n // step) * step


class StepInputs:
    """Token and position of a decode step as device tensors ``(1,)``, staged through a ring of
    pinned host buffers: the copy is asynchronous, so the host can queue the next step while the
    GPU still runs this one (a plain ``torch.tensor(..., device=...)`` would wait for it)."""

    def __init__(self, device: torch.device, slots: int = 8):
        self.device = device
        self.pinned = device.type == "cuda"
        if self.pinned:
            self.host = torch.empty(slots, 2, dtype=torch.long).pin_memory()
            self.done: list[Optional[torch.cuda.Event]] = [None] * slots
        self.i = 0

    def __call__(self, token: int, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pinned:
            t = torch.tensor([token, pos], dtype=torch.long, device=self.device)
            return t[0:1], t[1:2]
        s = self.i % len(self.done)
        self.i += 1
        if self.done[s] is not None:
            self.done[s].synchronize()  # the copy that last read this slot has run
        self.host[s, 0], self.host[s, 1] = token, pos
        dev = self.host[s].to(self.device, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self.done[s] = ev
        return dev[0:1], dev[1:2]


class Engine:
    def __init__(self, path: Path, gf: GGUFFile, cfg: ModelConfig, tok: Tokenizer, model: Transformer,
                 plan: Plan, wrap: Callable[[], tuple[Callable, Optional[Callable]]], ctx, load_s: float, pm=None,
                 wrap_decode: Optional[Callable[[Callable], Callable]] = None):
        self.path, self.gf, self.cfg, self.tok, self.model = path, gf, cfg, tok, model
        self.plan, self.ctx = plan, ctx
        self.pm = pm  # the plugin manager the plan was built with (the batched engine wraps its step through it)
        self._wrap = wrap
        # any step of the decode step's shape as the plan's decode_step plugin wraps it (a CUDA graph)
        self.wrap_decode = wrap_decode or (lambda step: step)
        self.rewrap()
        self.inputs = StepInputs(model.device)
        self.timings = Timings(load_s=load_s)
        self.cached: list[int] = []  # tokens whose K/V are in the cache, in order
        self.last_prefill = 0

    @classmethod
    def load(cls, path, *, backend: str | None = None, policy: str | None = None, blocked: Iterable[str] = (),
             device: str | None = None, n_ctx: int = 4096, trace_plugins: bool = False,
             trace_dispatch: bool = False, progress: bool = True) -> "Engine":
        t0 = time.perf_counter()
        path = Path(path)
        gf = open_gguf(path)
        cfg = config_from_gguf(gf)
        try:
            tok = Tokenizer.from_metadata(gf.metadata)
        except (ValueError, NotImplementedError) as e:  # e.g. an unknown pre-tokenizer
            raise ModelFileError(path, f"tokenizer: {e}") from None
        dev = pick_device(device)
        check_kv_fits(path, cfg, min(n_ctx, cfg.ctx_len) if n_ctx > 0 else cfg.ctx_len, dev,
                      torch.float16 if dev.type == "cuda" else torch.float32)  # before any weight moves
        pol = load_policy(policy)
        pm = get_plugin_manager(blocked=blocked, trace=trace_plugins)
        ctx = make_context(dev, pol, trace=trace_dispatch, gates=declared_gates(pm))
        check_backend(pm, ctx, backend)  # an impossible --backend fails before any data moves
        weights = weights_from_file(gf, cfg, dev, progress=progress)
        plan = build_plan(weights, ctx, pm, pol, backend)
        params = load_params(gf, cfg, weights, dev)
        n_ctx = min(n_ctx, cfg.ctx_len) if n_ctx > 0 else cfg.ctx_len
        # f16 K/V for the GPU and for kernel plugins; the CPU reference keeps f32
        plugin_attn = any(k.plugin != "reference" for k in plan.attention.values())
        kv_dtype = torch.float16 if dev.type == "cuda" or plugin_attn else torch.float32
        rt = Runtime(plan, {w.name: w for w in weights})
        model = Transformer(cfg, params, rt, n_ctx, dev, kv_dtype)

        def wrap_decode(step):
            return wrap_decode_step(step, ctx, pm, pol, plan, backend)

        def wrap():
            return wrap_decode(model.decode_step), wrap_step("prefill_step", model.prefill_step, ctx, pm, plan)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return cls(path, gf, cfg, tok, model, plan, wrap, ctx, time.perf_counter() - t0, pm, wrap_decode)

    def rewrap(self) -> None:
        """Fresh plugin wrappers of the decode step (``step``) and of ``model.prefill_step``
        (``prefill_step``, or None): after the model's cache is replaced, since a wrapper's CUDA graphs
        hold the old cache's addresses."""
        self.step, self.prefill_step = self._wrap()

    @property
    def n_params(self) -> int:
        return sum(math.prod(e.shape) for e in self.gf.tensors.values())

    @property
    def device(self) -> torch.device:
        return self.model.device

    # -- the two passes ------------------------------------------------------------------------
    def reset(self) -> None:
        self.cached = []

    def check_ids(self, ids: Sequence[int]) -> None:
        """UserError for an empty list or a token id outside the embedding table (which no kernel reads
        past)."""
        if len(ids) == 0:
            raise UserError("the prompt is empty")
        v = self.model.cfg.vocab_size
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= v:
            raise UserError(f"token id {lo if lo < 0 else hi} is outside the vocabulary (0 .. {v - 1})")

    def prefill(self, ids: Sequence[int], all_logits: bool = False) -> torch.Tensor:
        """Bring the cache to ``ids`` (reusing the longest cached prefix); logits of the last token
        (or of every new token with ``all_logits``). UserError for ids outside the vocabulary."""
        self.check_ids(ids)
        n = 0
        for a, b in zip(self.cached, ids):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)  # re-run at least one token to get its logits
        self.cached = list(ids[:n])
        self.last_prefill = len(ids) - n  # tokens actually run (the rest came from the cache)
        logits = self.run_prompt(ids[n:], n, all_logits=all_logits)
        self.cached = list(ids)
        return logits

    def run_prompt(self, tokens: Sequence[int], start: int, max_rows: Optional[int] = None,
                   all_logits: bool = False) -> torch.Tensor:
        """Run ``tokens`` at positions ``start ..`` (their K/V written to those rows of the cache);
        logits ``(1, vocab)`` of the last (of every token with ``all_logits``). From position 0 a
        plugin's prefill graph runs them padded to :func:`prompt_bucket` rows, writing K/V rows past
        the prompt too: only when those rows end within ``max_rows`` (default: the context)."""
        new = torch.tensor(tokens, dtype=torch.long, device=self.device)
        padded = prompt_bucket(len(new))
        if (self.prefill_step is not None and not all_logits and start == 0 and len(new) >= PREFILL_ROWS
                and padded <= min(self.model.n_ctx, max_rows or self.model.n_ctx)):
            padded_tokens = torch.zeros(padded, dtype=torch.long, device=self.device)
            padded_tokens[:len(new)] = new
            last = torch.tensor([len(new) - 1], dtype=torch.long, device=self.device)
            return self.prefill_step(padded_tokens, last)
        return self.model.prompt(new, start, all_logits)

    def decode(self, token: int) -> torch.Tensor:
        """Feed one token at the next position; logits (vocab,)."""
        self.check_ids([token])
        pos = len(self.cached)
        if pos >= self.model.n_ctx:
            raise ValueError("context full")
        logits = self.step(*self.inputs(token, pos))
        self.cached.append(token)
        return logits[0]

    # -- generation ----------------------------------------------------------------------------
    def generate(self, ids: Sequence[int], n_predict: int = -1, sampling: SamplerConfig | None = None,
                 stop: Sequence[str] = (), on_text: Optional[Callable[[str], None]] = None,
                 sampler: Sampler | None = None) -> Generation:
        """Continue ``ids``; stream text through ``on_text``; stop at end-of-generation tokens, a
        ``stop`` string (not emitted), ``n_predict`` tokens (-1: until the context is full)."""
        sampler = sampler or Sampler(sampling or SamplerConfig())
        out = Generation()
        text = StopStream(self.tok, stop)
        sync = self.device.type == "cuda"
        t0 = time.perf_counter()
        logits = self.prefill(ids)[-1]
        history = list(ids)
        if sync:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        self.timings.prompt_tokens, self.timings.prompt_s = len(ids), t1 - t0
        while n_predict != 0:
            token = sampler(logits, history)
            if token in self.tok.eog_ids:
                out.stop_reason = "eog"
                break
            out.tokens.append(token)
            history.append(token)
            emit = text.push(token)
            if emit:
                out.text += emit
                if on_text:
                    on_text(emit)
            if text.stopped:
                out.stop_reason = "stop"
                break
            if 0 <= n_predict <= len(out.tokens):
                out.stop_reason = "length"
                break
            if len(self.cached) + 1 >= self.model.n_ctx:
                out.stop_reason = "context"
                break
            logits = self.decode(token)
        out.stop_reason = out.stop_reason or "length"
        rest = text.finish()
        if text.stopped:
            out.stop_reason = "stop"
        out.text += rest
        if on_text and rest:
            on_text(rest)
        if sync:
            torch.cuda.synchronize()
        self.timings.gen_tokens, self.timings.gen_s = len(out.tokens), time.perf_counter() - t1
        return out


class StopStream:
    """Text of a token stream, UTF-8-safe, cut at the first stop string (which is not emitted).

    :meth:`push` returns the text that can be shown now: text that may begin a stop string is
    held back until the next tokens decide. After a stop string, :attr:`stopped` is set and
    :meth:`finish` returns nothing; otherwise :meth:`finish` returns what was held back, cut at a
    stop string that the flushed bytes complete (one ending in U+FFFD), which sets :attr:`stopped`.
    """

    def __init__(self, tok: Tokenizer, stop: Sequence[str] = ()):
        self.decoder = StreamDecoder(tok)
        self.stop = [s for s in stop if s]
        self.pending = ""
        self.stopped = False

    def push(self, token: int) -> str:
        self.pending += self.decoder.push(token)
        emit, self.pending = (self.pending, "") if self._cut() else _split_safe(self.pending, self.stop)
        return emit

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.pending += self.decoder.flush()
        self._cut()
        rest, self.pending = self.pending, ""
        return rest

    def _cut(self) -> bool:
        """Cut :attr:`pending` before its first stop string, if it holds one; True (and stopped) if so."""
        hit = min((self.pending.find(s) for s in self.stop if s in self.pending), default=-1)
        if hit >= 0:
            self.pending, self.stopped = self.pending[:hit], True
        return hit >= 0


def _split_safe(text: str, stops: Sequence[str]) -> tuple[str, str]:
    """Split ``text`` into what can be emitted now and a tail that may begin a stop string."""
    keep = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                keep = max(keep, k)
                break
    return (text[:-keep], text[-keep:]) if keep else (text, "")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
