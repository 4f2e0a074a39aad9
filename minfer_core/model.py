"""The transformer (Qwen2 and Llama families) over a resolved dispatch plan.

Reads top-down: rotary tables, KV cache, the runtime that calls the planned kernels, then the
model. :meth:`Transformer.forward` is its one forward, for every pass: it takes a
:class:`~minfer_core.step.Step` (tokens, their positions, how the rows attend, how they multiply,
which logits come back) and runs one block, :meth:`Transformer.layer` (``h += attn(norm(h)); h +=
ffn(norm(h))``), per layer. A prompt and a single-stream decode step attend on the contiguous
cache (:class:`~minfer_core.step.ContiguousPrompt`, :class:`~minfer_core.step.ContiguousToken`), a
batched step on the paged pool through block tables (:mod:`minfer_core.batch_forward`); each pass
multiplies through its :mod:`minfer_core.matmuls`. The forward makes no hook calls and reads no
environment: every kernel was chosen at load time (``minfer_core.dispatch``).
Shapes: T tokens, H query heads, Hkv KV heads, D head dim, E embedding width.
"""

from __future__ import annotations

from collections import Counter
import torch
import torch.nn.functional as F

from .model_config import ModelConfig
from .loader import ModelParams
from .matmuls import PREFILL_ROWS, DecodeMatmuls, PromptMatmuls, row_tiles
from .step import ContiguousPrompt, ContiguousToken, Step
from .reference import rmsnorm_rows as rmsnorm
from .weights import Activation, Weight


def rope_tables(cfg: ModelConfig, n_ctx: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (n_ctx, D/2), float32."""
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_base ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


class KVCache:
    """Per-layer K and V of shape (rows, Hkv, D): one contiguous cache for a single stream, or the
    storage of a paged pool (:mod:`minfer_core.kv_pages`), seen per layer as ``(rows //
    block_size, block_size, Hkv, D)``. A single sequence in blocks 0, 1, 2, ... is the contiguous
    cache, so the single-stream passes read the first ``n_ctx`` rows of the same storage."""

    def __init__(self, cfg: ModelConfig, rows: int, device, dtype):
        shape = (cfg.n_layers, rows, cfg.n_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.rows = rows

    def pages(self, layer: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as (n_blocks, block_size, Hkv, D) views."""
        n = self.rows // block_size
        k, v = self.k[layer, :n * block_size], self.v[layer, :n * block_size]
        return k.view(n, block_size, *k.shape[1:]), v.view(n, block_size, *v.shape[1:])


class Runtime:
    """Calls the kernels of a plan and counts dispatch labels (``--trace-dispatch``)."""

    def __init__(self, plan, weights: dict[str, Weight]):
        self.plan = plan
        self.weights = weights  # the weights (and the planes plugins built) live as long as the model
        self.counts: Counter[str] = Counter()
        self.attn_prefill = plan.attention["prefill"]
        self.attn_decode = plan.attention["decode"]
        self.attn_paged = plan.attention.get("paged_decode")  # the batched engine's single rows
        self.attn_paged_prefill = plan.attention.get("paged_prefill")  # ... and its prompt segments
        self.producers = plan.producers  # 'rmsnorm', 'swiglu', 'prepass' (only those in force)
        self.dec_rmsnorm = plan.decode_ops["decode_rmsnorm"]  # single-token ops (decode order, no gate)
        self.dec_rope_kv = plan.decode_ops["decode_rope_kv"]
        self.embed_op = plan.decode_ops["embed"]
        self.pre_rope_kv = plan.prefill_ops["prefill_rope_kv"]  # RoPE + KV write of a prompt's rows

    def embed(self, table: torch.Tensor, qtype, n_cols: int, tokens: torch.Tensor) -> torch.Tensor:
        return self._run(self.embed_op, table, qtype, n_cols, tokens)

    def _run(self, kernel, *args, **kw):
        self.counts[kernel.label] += 1
        return kernel.fn(*args, **kw)

    def linear(self, name: str, x, residual: torch.Tensor | None = None, glu_into: str | None = None,
               bf16_out: bool = False):
        """x: Activation (prefill) or f32 tensor (M, K) -> f32 (M, N), ``residual +`` it when
        given (inside a prefill kernel whose candidate ``fuses`` it). ``bf16_out``: the product
        feeds only the SwiGLU, so a prefill kernel that ``fuses`` ``"bf16_out"`` may return bf16;
        ``glu_into`` (a ``[gate | up]`` weight): so does this one, and the SwiGLU's output goes to the
        weight ``glu_into``. When that weight's prefill kernel reads the plane alone, a kernel that
        ``fuses`` ``"swiglu_out"`` may return an :class:`Activation` of ``silu(g) * u`` instead."""
        rows = x.rows if isinstance(x, Activation) else x.shape[0]
        bf16_out = bf16_out or glu_into is not None
        if rows >= PREFILL_ROWS:
            act = x if isinstance(x, Activation) else self.produce(x)
            c = self.plan.prefill[name]
            kw = {"out_bf16": True} if bf16_out and "bf16_out" in c.fuses else {}
            if glu_into is not None and residual is None and "swiglu_out" in c.fuses \
                    and getattr(self.plan.prefill.get(glu_into), "reads", None) == ("plane",):
                kw["swiglu_out"] = True
            if residual is not None and "residual" in c.fuses:
                return self._run(c, act, residual=residual, **kw)
            y = self._run(c, act, **kw)
        else:
            y = self._run(self.plan.decode[name], x.f32 if isinstance(x, Activation) else x)
        return y if residual is None else residual + y

    def attend_prompt(self, o_name: str, q, k, v, start: int):
        """The prefill attention's output for the o matmul ``o_name``: f32 rows, or an Activation
        of the plane alone when the attention writes it (``fuses`` ``"plane"``) and o's prefill
        kernel reads nothing else (no f32 copy, no prepass)."""
        c = self.attn_prefill
        if q.shape[0] >= PREFILL_ROWS and "plane" in c.fuses and self.plan.prefill[o_name].reads == ("plane",):
            return self._run(c, q, k, v, start, plane=True)
        return self._run(c, q, k, v, start)

    def tiled_linear(self, name: str, act: Activation, tile: int) -> torch.Tensor:
        """The prefill kernel of ``name`` over fixed tiles of ``tile`` rows of ``act`` (whole tiles,
        ``tile >= PREFILL_ROWS``): a row's bits depend on that row and ``tile`` alone."""
        c = self.plan.prefill[name]
        self.counts[c.label] += 1
        if c.tiled is not None:
            return c.tiled(act, tile)
        ys = [c.fn(act[t]) for t in row_tiles(act.rows, tile)]
        return ys[0] if len(ys) == 1 else torch.cat(ys)

    def decode_linear(self, name: str, x, residual: torch.Tensor | None = None,
                      norm: tuple | None = None, swiglu: bool = False, glu_out: bool = False):
        """Single-token ``[residual +] f(x) @ W.T`` where ``f`` is an optional RMSNorm (``norm=(w,
        eps)``) or SwiGLU; each piece runs inside the kernel when its candidate ``fuses`` it. ``x``:
        f32 rows, or an :class:`Activation` whose ``forms`` the candidate may read. ``glu_out``: the
        product feeds only the SwiGLU; a candidate that ``fuses`` ``"glu_out"`` then returns an
        Activation whose forms hold ``silu(g) * u`` for the down projection's candidate."""
        return self._fused(self.plan.decode[name], x, residual, norm, swiglu, glu_out)

    def batch_linear(self, name: str, x: torch.Tensor, residual: torch.Tensor | None = None,
                     norm: tuple | None = None, swiglu: bool = False) -> torch.Tensor:
        """:meth:`decode_linear` over all rows of a batched step, on the weight's row-invariant
        kernel (``plan.batch``; only for weights that have one)."""
        return self._fused(self.plan.batch[name], x, residual, norm, swiglu)

    def _fused(self, c, x, residual, norm, swiglu, glu_out=False):
        kw = {"glu_out": True} if glu_out and residual is None and "glu_out" in c.fuses else {}
        if isinstance(x, Activation):  # the forms of x the candidate reads (it knows which are of x and
            forms = {f: x.forms[f] for f in c.reads if f in x.forms}  # which of its SwiGLU)
            if forms and norm is None and (not swiglu or "swiglu" in c.fuses):
                kw["forms"] = forms
            x = x.f32
        if norm is not None:
            if "rmsnorm" in c.fuses:
                kw["norm"] = norm
            else:
                x = self._run(self.dec_rmsnorm, x, *norm)
        if swiglu:
            if "swiglu" in c.fuses:
                kw["swiglu"] = True
            else:
                g, u = x.chunk(2, dim=-1)
                x = F.silu(g) * u
        if residual is not None and "residual" in c.fuses:
            kw["residual"], residual = residual, None
        y = self._run(c, x, **kw)
        return y if residual is None else residual + y

    def decode_normed(self, names: list[str], h: torch.Tensor, norm: tuple, glu_out: bool = False) -> list:
        """``x @ W.T`` of each weight for ``x = rmsnorm(h)``: by the group's one kernel where the plan
        has one for these weights (``plan.decode_groups``); else fused into every kernel when all of
        them can, else one RMSNorm launch shared by all. ``glu_out``: as :meth:`decode_linear`
        (asked of a single fused ``[gate | up]`` weight only)."""
        group = self.plan.decode_groups.get(tuple(names))
        if group is not None:
            if "rmsnorm" in group.fuses:
                return list(self._run(group, h, norm=norm))
            return list(self._run(group, self._run(self.dec_rmsnorm, h, *norm)))
        glu_out = glu_out and len(names) == 1
        if all("rmsnorm" in self.plan.decode[n].fuses for n in names):
            return [self.decode_linear(n, h, norm=norm, glu_out=glu_out) for n in names]
        a = self._run(self.dec_rmsnorm, h, *norm)
        return [self.decode_linear(n, a, glu_out=glu_out) for n in names]

    def produce(self, x: torch.Tensor) -> Activation:
        """Wrap an f32 activation for its consumers (the prepass writes the plane once)."""
        if x.shape[0] >= PREFILL_ROWS and "prepass" in self.producers:
            return self._run(self.producers["prepass"], x)
        return Activation(x)

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> Activation:
        if x.shape[0] >= PREFILL_ROWS and "rmsnorm" in self.producers:
            return self._run(self.producers["rmsnorm"], x, w, eps)
        return self.produce(rmsnorm(x, w, eps))

    def swiglu(self, gu: torch.Tensor) -> Activation:
        if gu.shape[0] >= PREFILL_ROWS and "swiglu" in self.producers:
            return self._run(self.producers["swiglu"], gu)
        g, u = gu.float().chunk(2, dim=-1)  # gu may be bf16 (Runtime.linear's bf16_out)
        return self.produce(F.silu(g) * u)


class Transformer:
    def __init__(self, cfg: ModelConfig, params: ModelParams, rt: Runtime, n_ctx: int, device, kv_dtype):
        self.cfg, self.p, self.rt = cfg, params, rt
        self.device = torch.device(device)
        self.kv_dtype = kv_dtype
        self.cache = KVCache(cfg, n_ctx, device, kv_dtype)
        self.cos, self.sin = rope_tables(cfg, n_ctx, device)
        self.n_ctx = n_ctx
        self.q_dim = cfg.n_heads * cfg.head_dim
        self.kv_dim = cfg.n_kv_heads * cfg.head_dim

    def resize_cache(self, rows: int) -> None:
        """Replace the cache by one of ``rows`` rows (a paged pool); the old one is freed first."""
        self.cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.cache = KVCache(self.cfg, rows, self.device, self.kv_dtype)

    # -- pieces ----------------------------------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Rows ``tokens`` of the embedding table, float32 (the plan's embed op)."""
        return self.rt.embed(self.p.tok_embd, self.p.tok_embd_type, self.cfg.n_embd, tokens)

    def split_qkv(self, outs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """q, k, v from the outputs of a layer's attention weights (one fused qkv, qk and v, or three)."""
        if len(outs) == 1:
            return outs[0].split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        if len(outs) == 2:
            return (*outs[0].split([self.q_dim, self.kv_dim], dim=-1), outs[1])
        return tuple(outs)

    @staticmethod
    def join_gate_up(outs: list[torch.Tensor]) -> torch.Tensor:
        """``[g | u]`` from the outputs of a layer's ffn input weights (one fused gate_up, or two), or the
        one output as it is (an :class:`Activation` of ``silu(g) * u`` from a prompt's gate|up kernel)."""
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    def layer(self, i: int, h: torch.Tensor, mm, attend) -> torch.Tensor:
        """Block ``i`` over hidden rows ``h`` (T, E): ``mm`` multiplies (:mod:`minfer_core.matmuls`),
        ``attend(i, q, k, v)`` applies RoPE, writes K/V and returns the attention output (T, H D)."""
        cfg, p, lw = self.cfg, self.p, self.p.layers[i]
        q, k, v = self.split_qkv(mm(lw.attn, h, norm=(p.attn_norm[i], cfg.rms_eps)))
        h = mm([lw.o], attend(i, q, k, v), residual=h)[0]
        gu = self.join_gate_up(mm(lw.ffn, h, norm=(p.ffn_norm[i], cfg.rms_eps), glu_into=lw.down))
        return mm([lw.down], gu, swiglu=True, residual=h)[0]

    def head(self, h: torch.Tensor, mm) -> torch.Tensor:
        """Logits of hidden rows ``h``: the output norm, then the output weight (``mm``: the pass's
        matmuls)."""
        return mm(["output"], h, norm=(self.p.out_norm, self.cfg.rms_eps), plain_norm=True)[0]

    # -- the forward ---------------------------------------------------------------------
    def forward(self, step: Step) -> torch.Tensor:
        """The one forward of every pass (:mod:`minfer_core.step`): embed ``step.tokens``, run each
        block with the step's matmuls and attention, and return the logits (L, vocab) float32 of
        ``step.logit_rows``. Reads no host value of the step's tensors (a plugin may capture it)."""
        cos, sin = self.cos[step.positions], self.sin[step.positions]

        def attend(i, q, k, v):
            return step.attention(self, i, q, k, v, cos, sin)

        h = self.embed(step.tokens)
        for i in range(self.cfg.n_layers):
            h = self.layer(i, h, step.mm, attend)
        rows = step.logit_rows
        if rows is not None:
            h = h[rows] if isinstance(rows, slice) else h.index_select(0, rows)
        if h.shape[0] == 0:
            return h.new_zeros(0, self.cfg.vocab_size)
        return self.head(h, step.head_mm or step.mm)

    # -- the single stream's steps (what engine.py runs, and plugins wrap) -------------------
    def prompt(self, tokens: torch.Tensor, start: int, all_logits: bool = False) -> torch.Tensor:
        """Tokens (T,) at positions start..start+T-1 of the contiguous cache; logits (T or 1, vocab)."""
        T = tokens.shape[0]
        return self._contiguous_prompt(tokens, start, None if all_logits else slice(T - 1, T))

    def prefill_step(self, tokens: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Tokens (T,) from position 0; logits (1, vocab) of row ``last`` ((1,) int64, on the device).

        Reads no host value of ``last``, so a prompt padded to a bucket length can be captured as
        a CUDA graph once and replayed for every prompt of that bucket (causal attention keeps the
        padding rows out of the real ones; their K/V rows are overwritten as the cache grows).
        """
        return self._contiguous_prompt(tokens, 0, last)

    def _contiguous_prompt(self, tokens: torch.Tensor, start: int, logit_rows) -> torch.Tensor:
        """The forward of tokens (T,) at positions start..start+T-1 of the contiguous cache."""
        T = tokens.shape[0]
        if start + T > self.n_ctx:
            raise ValueError(f"context full: {start + T} tokens > n_ctx {self.n_ctx}")
        positions = torch.arange(start, start + T, device=tokens.device)
        return self.forward(Step(tokens, positions, ContiguousPrompt(start), PromptMatmuls(self.rt), logit_rows))

    def decode_step(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One token (1,) at position pos (1,) int64, both on the device; logits (1, vocab).

        Reads no host value of ``pos``, so the step can be captured as a CUDA graph.
        """
        return self.forward(Step(token, pos, ContiguousToken(pos), DecodeMatmuls(self.rt)))
