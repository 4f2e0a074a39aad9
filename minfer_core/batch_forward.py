"""The batched engine's step over the paged KV pool, as a :class:`~minfer_core.step.Step` of the
model's one forward.

A step holds rows of any mix of sequences: prompt segments (several rows attending together) and
single rows (a decode token, or a generated token recomputed after preemption). Each layer is the
model's one block (``Transformer.layer``) with this module's attention (:class:`PagedRows`) and the
engine's matmuls.
Rows at generated positions (and the output head's) take the batched ones
(:class:`~minfer_core.matmuls.BatchMatmuls`): a weight with a row-invariant kernel (``plan.batch``:
its rows' bits never depend on the row count) multiplies all rows at once, RMSNorm, SwiGLU and the
residual fused as its candidate says; every other weight, with its norms, runs over fixed tiles of
rows (padded), so a row never shares a matmul shape with a different number of rows. Rows at
prompt positions take the engine's prompt matmuls (:class:`~minfer_core.matmuls.TiledPromptMatmuls`:
fixed tiles of their own). Which a row takes depends on its position in its sequence alone. RoPE
and the K/V write run in one call of the plan's ``prefill_rope_kv`` op with each row's pool slot.
Every single row goes into one call per layer of the plan's ``paged_decode`` attention, whose
entries are independent; the prompt segments go into one call per layer of its ``paged_prefill``
attention, whose calls are independent too. A row's result is then the same bits whatever else
the batch holds (batch invariance).

:func:`decode_rows` is the decode-only step on fixed shapes that reads nothing on the host, so a
plugin may capture it (hook ``minfer_wrap_batch_step``: cuda_graphs' CUDA graphs); it is
:func:`batch_step` on such a batch.
Shapes: T rows, H query heads, Hkv KV heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .matmuls import Matmuls, SplitMatmuls
from .step import Step

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # entry counts of the paged attention (and of graphs)


def bucket(n: int) -> int:
    """The smallest bucket holding ``n`` entries (past the last: a multiple of it)."""
    top = BUCKETS[-1]
    return next((b for b in BUCKETS if b >= n), -(-n // top) * top)


@dataclass
class Batch:
    """The rows of one batched step.

    tokens, positions, slots (T,) int64 on the device: each row's token, its position in its
    sequence and the pool row its K/V go to. The multi-row attention calls: calls (C, 4) int32 (first
    row, row count, first position, row of call_tables), call_tables (S, max_blocks) int32 (their
    sequences' block tables), call_rows the most rows of a call (host int). The single
    rows, padded to ``bucket(n_single)`` entries: single_rows (E,) int64 (rows of this batch in
    increasing order, then any row for padding), tables (E, max_blocks) int32 (padding: the scratch
    block), lens (E,) int32 (position + 1; padding 1); ``n_single`` of them are real. logit_rows (L,) int64: the
    rows whose logits are wanted, in order.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    calls: torch.Tensor
    call_tables: torch.Tensor
    call_rows: int
    logit_rows: torch.Tensor
    single_rows: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    n_single: int
    n_gen: int  # rows [0, n_gen) are at generated positions, the rest at prompt ones


class PagedRows:
    """How a batched step's rows attend (a :class:`~minfer_core.step.Step`'s attention): RoPE and
    the K/V write at each row's pool slot in one call of the plan's ``prefill_rope_kv``; the single
    rows in one call of ``attn`` (a paged_decode Candidate: the engine's, see ``BatchEngine.attn``),
    the prompt segments in one call of the plan's ``paged_prefill``, both through block tables.
    Reads no host value of any tensor of ``b``."""

    def __init__(self, b: Batch, block_size: int, attn):
        self.b, self.block_size, self.attn = b, block_size, attn
        # only single rows, at a bucket: the rows are the paged attention's entries, in order (single_rows
        # is increasing, so it is 0 .. T-1)
        self.all_single = b.n_single == b.tokens.shape[0] == b.single_rows.shape[0]

    def __call__(self, model, i: int, q, k, v, cos, sin) -> torch.Tensor:
        b, cfg, rt = self.b, model.cfg, model.rt
        T, H, Hkv, D = q.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q = rt._run(rt.pre_rope_kv, q.reshape(T, H, D), k.reshape(T, Hkv, D), v.reshape(T, Hkv, D),
                    cos, sin, model.cache.k[i], model.cache.v[i], b.slots, cfg.rope_style == "neox")
        kp, vp = model.cache.pages(i, self.block_size)
        if self.all_single:
            return rt._run(self.attn, q, kp, vp, b.tables, b.lens).reshape(T, H * D).contiguous()
        o = torch.empty(T, H * D, device=q.device, dtype=torch.float32)  # each row: single or in a call
        if b.n_single:
            out = rt._run(self.attn, q.index_select(0, b.single_rows), kp, vp, b.tables, b.lens)
            o.index_copy_(0, b.single_rows[:b.n_single], out[:b.n_single].reshape(b.n_single, H * D))
        if b.call_rows:
            rt._run(rt.attn_paged_prefill, q, kp, vp, b.calls, b.call_tables, o, b.call_rows)
        return o


def batch_step(b: Batch, block_size: int, mm: Matmuls, attn, prompt_mm: Optional[Matmuls] = None) -> Step:
    """The :class:`~minfer_core.step.Step` of one batched step over the paged pool: the rows at
    generated positions (and the output head) multiply with ``mm``, those at prompt positions with
    ``prompt_mm`` (default ``mm``); the single rows attend with ``attn``; logits of ``b.logit_rows``."""
    T = b.tokens.shape[0]
    layer_mm = mm if prompt_mm is None or b.n_gen == T else prompt_mm if b.n_gen == 0 else \
        SplitMatmuls(mm, prompt_mm, b.n_gen)
    return Step(b.tokens, b.positions, PagedRows(b, block_size, attn), layer_mm, b.logit_rows, head_mm=mm)


def decode_rows(model, inputs: torch.Tensor, block_size: int, mm: Matmuls, attn) -> torch.Tensor:
    """A decode-only step from one packed int64 device tensor ``inputs`` (E, 4 + max_blocks):
    per entry its token, position, slot, seq_len and block table (E a bucket; padding entries
    point at the scratch block). Logits (E, vocab). Reads nothing on the host (capturable)."""
    e = inputs.shape[0]
    entries = torch.arange(e, device=inputs.device)
    none = inputs.new_empty(0, 4, dtype=torch.int32)
    b = Batch(inputs[:, 0].contiguous(), inputs[:, 1].contiguous(), inputs[:, 2].contiguous(), none, none, 0,
              entries, entries,
              inputs[:, 4:].to(torch.int32), inputs[:, 3].to(torch.int32), e, e)
    return model.forward(batch_step(b, block_size, mm, attn))
