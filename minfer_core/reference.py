"""The built-in reference backend: plain dequantize + torch ops, on CPU or GPU.

It is registered by the core under the name ``reference``, cannot be blocked, offers a kernel for
every matmul and attention, and is the oracle every other kernel is tested against. Its matmul
dequantizes a weight to float32 the first time it runs and keeps that copy in
``weight.planes['reference.f32']``.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .dequant import dequantize
from .hookspecs import hookimpl
from .weights import Activation, Candidate, Weight

NAME = "reference"


def dense(weight: Weight) -> torch.Tensor:
    """The weight as float32 ``(n_out, n_in)``."""
    return dequantize(weight.raw, weight.qtype, weight.n_in)


def _matmul_fn(weight: Weight):
    def fn(x) -> torch.Tensor:
        if isinstance(x, Activation):
            x = x.f32 if x.f32 is not None else x.plane.float()
        w = weight.planes.get("reference.f32")
        if w is None:  # first call (prefill and decode share the copy)
            w = weight.planes["reference.f32"] = dense(weight)
        y = x @ w.T
        return y + weight.bias if weight.bias is not None else y

    return fn


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal GQA attention: q (T, H, D), k/v (start+T, Hkv, D) -> (T, H*D) float32."""
    T, H, D = q.shape
    rep = H // k.shape[1]
    qh = q.transpose(0, 1).float()
    kh = k.transpose(0, 1).float().repeat_interleave(rep, 0)
    vh = v.transpose(0, 1).float().repeat_interleave(rep, 0)
    if start == 0:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    else:
        i = torch.arange(T, device=q.device)[:, None] + start
        mask = torch.arange(start + T, device=q.device)[None, :] <= i
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return o.transpose(0, 1).reshape(T, H * D)


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_valid: torch.Tensor) -> torch.Tensor:
    """One query over the cache: (H, D) -> (H*D,). On the GPU the whole cache is read and masked by
    ``n_valid`` on the device (capturable); on the CPU only the valid prefix is read."""
    H, D = q.shape
    if not q.is_cuda:
        n = int(n_valid)
        k_cache, v_cache = k_cache[:n], v_cache[:n]
    n_ctx, Hkv, _ = k_cache.shape
    rep = H // Hkv
    qg = q.float().view(Hkv, rep, D)
    scores = torch.einsum("grd,ngd->grn", qg, k_cache.float()) / math.sqrt(D)
    valid = torch.arange(n_ctx, device=q.device) < n_valid
    scores = scores.masked_fill(~valid, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("grn,ngd->grd", p, v_cache.float()).reshape(H * D)


def attention_paged_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """One query row per entry over a paged pool: q (N, H, D), pages (n_blocks, PAGE, Hkv, D),
    block_tables (N, max_blocks), seq_lens (N,) -> (N, H*D) float32.

    Each entry is computed on its own (its K/V gathered through its block table), so its bits do
    not depend on the other entries. On the CPU only the ``seq_lens`` valid rows are gathered; on
    the GPU the whole table is gathered and masked on the device (no host read: capturable)."""
    n, h, d = q.shape
    page = k_pages.shape[1]
    kf, vf = k_pages.flatten(0, 1), v_pages.flatten(0, 1)
    lens = seq_lens.tolist() if not q.is_cuda else None
    out = torch.empty(n, h * d, dtype=torch.float32, device=q.device)
    offs = torch.arange(page, device=q.device)
    for b in range(n):
        table = block_tables[b] if lens is None else block_tables[b, :-(-lens[b] // page)]
        rows = (table.long()[:, None] * page + offs).flatten()
        nv = seq_lens[b] if lens is None else lens[b]
        out[b] = attention_decode(q[b], kf.index_select(0, rows), vf.index_select(0, rows), nv)
    return out


def attention_paged_prefill(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, calls: torch.Tensor,
                            block_tables: torch.Tensor, out: torch.Tensor, max_rows: int) -> torch.Tensor:
    """Prompt rows over a paged pool: each call ``(first row, rows, first position, table row)`` of
    ``calls`` (C, 4) is :func:`attention_prefill` of its rows of q (T, H, D) over its sequence's keys
    gathered through ``block_tables`` (S, max_blocks); written into those rows of ``out`` (T, H*D)
    float32. Reads the calls on the host."""
    page = k_pages.shape[1]
    kf, vf = k_pages.flatten(0, 1), v_pages.flatten(0, 1)
    offs = torch.arange(page, device=q.device)
    for r0, nr, p0, ti in calls.tolist():
        end = p0 + nr
        rows = (block_tables[ti, :-(-end // page)].long()[:, None] * page + offs).flatten()[:end]
        out[r0:r0 + nr] = attention_prefill(q[r0:r0 + nr], kf.index_select(0, rows), vf.index_select(0, rows), p0)
    return out


def rmsnorm_rows(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each row: x (M, E) f32, w (E,) -> (M, E)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """RoPE on x (T, heads, D) with cos/sin (T, D/2): neox rotates halves, normal adjacent pairs."""
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, pos, neox: bool) -> torch.Tensor:
    """One token: rotate q (H*D,) and k (Hkv*D,), write k and v into row ``pos`` (1,) of the
    caches (n_ctx, Hkv, D); return q as (H, D) f32. Reads nothing on the host."""
    hkv, d = k_cache.shape[1], k_cache.shape[2]
    qr = rotate(q.view(1, -1, d), cos, sin, neox)[0]
    kr = rotate(k.view(1, hkv, d), cos, sin, neox)
    k_cache.index_copy_(0, pos, kr.to(k_cache.dtype))
    v_cache.index_copy_(0, pos, v.view(1, hkv, d).to(v_cache.dtype))
    return qr


def rope_kv_rows(q, k, v, cos, sin, k_cache, v_cache, start, neox: bool) -> torch.Tensor:
    """T tokens: rotate q (T, H, D) and k (T, Hkv, D) by their rows of cos/sin (T, D/2), write k
    and v into cache rows ``start .. start + T - 1`` (``start`` an int) or ``start[t]`` (a (T,)
    int64 device tensor: a batch's pool rows); return rotated q (T, H, D)."""
    t = q.shape[0]
    kr = rotate(k, cos, sin, neox).to(k_cache.dtype)
    if isinstance(start, torch.Tensor):
        k_cache.index_copy_(0, start, kr)
        v_cache.index_copy_(0, start, v.to(v_cache.dtype))
    else:
        k_cache[start:start + t] = kr
        v_cache[start:start + t] = v.to(v_cache.dtype)
    return rotate(q, cos, sin, neox)


@hookimpl
def minfer_decode_rmsnorm_candidates(ctx):
    return [Candidate(NAME, "ref.dec.rmsnorm", rmsnorm_rows)]


@hookimpl
def minfer_decode_rope_kv_candidates(ctx):
    return [Candidate(NAME, "ref.dec.rope_kv", rope_kv_write)]


@hookimpl
def minfer_argmax_candidates(ctx):
    return [Candidate(NAME, "ref.argmax", functools.partial(torch.argmax, dim=-1))]


def embed_rows(table: torch.Tensor, qtype, n_cols: int, tokens: torch.Tensor) -> torch.Tensor:
    """Rows ``tokens`` of the raw embedding ``table``, dequantized (float32 ``(T, n_cols)``)."""
    return dequantize(table[tokens], qtype, n_cols)


@hookimpl
def minfer_embed_candidates(ctx):
    return [Candidate(NAME, "ref.embed", embed_rows)]


@hookimpl
def minfer_prefill_rope_kv_candidates(ctx):
    return [Candidate(NAME, "ref.pre.rope_kv", rope_kv_rows)]


@hookimpl
def minfer_matmul_candidates(weight, phase, ctx):
    label = f"ref.{weight.qtype.name.lower()}"
    return [Candidate(NAME, label, _matmul_fn(weight))]


@hookimpl
def minfer_attention_candidates(phase, ctx):
    fn = {"decode": attention_decode, "prefill": attention_prefill, "paged_decode": attention_paged_decode,
          "paged_prefill": attention_paged_prefill}.get(phase)
    return None if fn is None else [Candidate(NAME, f"ref.attn.{phase}", fn)]
