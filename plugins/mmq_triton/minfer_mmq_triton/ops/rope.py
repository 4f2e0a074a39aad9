"""RoPE + KV-cache write: one launch for the single token of a decode step (``rope_kv_write``) and
for the T rows of a prefill (``rope_kv_rows``).

``rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, pos, neox)`` rotates this token's ``q`` and
``k`` heads, writes rotated ``k`` and plain ``v`` as float16 into row ``pos`` of the caches, and
returns rotated ``q``. ``pos`` is a device tensor read only inside the kernel, and the grid depends
only on shapes, so the call can be captured in a CUDA graph and replayed at any position.

Rotation of a pair ``(a, b)`` with ``c = cos[i]``, ``s = sin[i]``: ``(a c - b s, a s + b c)``.
``neox=True`` (qwen2) pairs ``(i, i + D/2)``; ``neox=False`` (llama) pairs ``(2i, 2i + 1)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter, launch_args


#: Tokens a prefill program rotates (one head each): enough work per program that a prompt of
#: thousands of rows is not a launch of one tiny program per token and head.
ROWS_BLOCK = 16


@triton.jit
def _rope_kv_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, qo_ptr,
    # sizes: tokens, heads; the first cache row when rows are counted from a host value (POS_PTR False)
    n_tok, n_heads, start,
    # strides: rows of q, k, v, cos/sin (one per token; heads within a row are D apart), caches
    stride_qt, stride_kt, stride_vi, stride_cs, stride_ct, stride_ch, stride_vt, stride_vh,
    # meta
    D: tl.constexpr, NEOX: tl.constexpr, POS_PTR: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr,
):
    """Tokens ``t`` of block ``program_id(1)`` (``BLOCK_T`` of them); program ``p < n_heads``:
    rotate q head ``p`` into qo (T, n_heads, D) float32. Program ``p >= n_heads``: KV head ``h = p -
    n_heads``; rotate k head ``h`` into ``k_cache[row, h]`` and copy v head ``h`` into ``v_cache[row,
    h]`` (both float16), where ``row = pos[t]`` (POS_PTR, a device tensor: graph friendly) or
    ``start + t``. cos/sin rows (D/2,) float32; caches (n_ctx, n_kv, D) float16.
    """
    enter(PDL)
    p = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    tm = t < n_tok
    i = tl.arange(0, D // 2)[None, :]
    if NEOX:
        ia = i
        ib = i + D // 2
    else:
        ia = 2 * i
        ib = 2 * i + 1
    c = tl.load(cos_ptr + t * stride_cs + i, mask=tm)
    s = tl.load(sin_ptr + t * stride_cs + i, mask=tm)
    if p < n_heads:
        qr = q_ptr + t * stride_qt + p * D
        a = tl.load(qr + ia, mask=tm)
        b = tl.load(qr + ib, mask=tm)
        qo = qo_ptr + (t * n_heads + p) * D
        tl.store(qo + ia, a * c - b * s, mask=tm)
        tl.store(qo + ib, a * s + b * c, mask=tm)
    else:
        h = p - n_heads
        if POS_PTR:
            row = tl.load(pos_ptr + t, mask=tm).to(tl.int64)
        else:
            row = (start + t).to(tl.int64)
        krow = kc_ptr + row * stride_ct + h * stride_ch
        kr = k_ptr + t * stride_kt + h * D
        a = tl.load(kr + ia, mask=tm)
        b = tl.load(kr + ib, mask=tm)
        d = tl.arange(0, D)[None, :]
        # v loads before k's stores, which the compiler may not move it past (they could alias)
        v = tl.load(v_ptr + t * stride_vi + h * D + d, mask=tm)
        tl.store(krow + ia, (a * c - b * s).to(tl.float16), mask=tm)
        tl.store(krow + ib, (a * s + b * c).to(tl.float16), mask=tm)
        tl.store(vc_ptr + row * stride_vt + h * stride_vh + d, v.to(tl.float16), mask=tm)


def check_token_rows(who: str, q, k, v, cos, sin, k_cache, v_cache) -> None:
    """What a decode step's RoPE + KV write asks of its inputs (``rope_kv_write``, and the decode attention
    that does its work): float16 caches ``(n_ctx, n_kv, D)`` with contiguous heads, an even D, float32
    contiguous ``q`` (n_heads * D), ``k`` and ``v`` (n_kv * D), ``cos`` and ``sin`` (D/2). ValueError
    naming ``who`` otherwise."""
    _, n_kv, d = k_cache.shape
    if d % 2 or cos.numel() * 2 != d or sin.numel() * 2 != d:
        raise ValueError(f"{who}: head size {d} must be even and cos/sin hold D/2")
    if v_cache.shape != k_cache.shape or k_cache.dtype != torch.float16 or v_cache.dtype != torch.float16:
        raise ValueError(f"{who}: k_cache and v_cache must be float16 (n_ctx, n_kv, D)")
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError(f"{who}: cache heads must be contiguous")
    for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"{who}: {name} must be float32 and contiguous")
    if q.numel() % d or k.numel() != n_kv * d or v.numel() != n_kv * d:
        raise ValueError(f"{who}: q must hold n_heads*D, k and v n_kv*D")


def rope_kv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                  neox: bool, pdl: bool = False) -> torch.Tensor:
    """RoPE for one token plus the KV-cache write, in one launch; returns rotated q (n_heads, D) f32.

    q (n_heads*D,), k and v (n_kv*D,) float32, each contiguous in itself (views of a fused qkv
    row are fine); cos, sin (1, D/2) float32, the row of this position; k_cache, v_cache
    (n_ctx, n_kv, D) float16; pos (1,) int64 device tensor, the cache row written (never read on
    the host). Writes rotated k to ``k_cache[pos]`` and v to ``v_cache[pos]`` as float16.
    """
    _, n_kv, d = k_cache.shape
    if d & (d - 1):
        raise ValueError(f"rope_kv_write: head size {d} must be a power of two")
    check_token_rows("rope_kv_write", q, k, v, cos, sin, k_cache, v_cache)
    if pos.numel() != 1:
        raise ValueError("rope_kv_write: pos must be one index")
    n_heads = q.numel() // d
    q_out = torch.empty(n_heads, d, dtype=torch.float32, device=q.device)
    _rope_kv_kernel[(n_heads + n_kv, 1)](
        q, k, v, cos, sin, k_cache, v_cache, pos, q_out,
        1, n_heads, 0,
        0, 0, 0, 0, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        D=d, NEOX=bool(neox), POS_PTR=True, BLOCK_T=1, num_warps=1 if d <= 64 else 2, **launch_args(pdl),
    )
    return q_out


def rope_kv_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor, start, neox: bool, pdl: bool = False) -> torch.Tensor:
    """The prefill's RoPE and KV-cache write for T tokens at positions ``start ..``, in one launch.

    q (T, n_heads, D), k and v (T, n_kv, D) float32 whose heads are contiguous (rows may be
    strided: views of a fused qkv output are fine); cos, sin (T, D/2) float32; caches
    (n_ctx, n_kv, D) float16. Writes rotated k and v into cache rows ``start .. start + T - 1``
    and returns rotated q as a new float32 (T, n_heads, D). ``start`` may instead be a (T,) int64
    device tensor, the cache row of each token (a batch's pool rows; read only in the kernel).
    ``pdl``: launch with programmatic dependent launch (``launch.pdl``).
    """
    rows = start if isinstance(start, torch.Tensor) else None
    t, n_heads, d = q.shape
    n_kv = k.shape[1]
    if d & (d - 1) or cos.shape != (t, d // 2) or sin.shape != (t, d // 2):
        raise ValueError(f"rope_kv_rows: head size {d} must be a power of two and cos/sin (T, D/2)")
    if k_cache.dtype != torch.float16 or v_cache.dtype != torch.float16 or k_cache.stride(2) != 1 \
            or v_cache.stride(2) != 1 or (rows is None and start + t > k_cache.shape[0]):
        raise ValueError("rope_kv_rows: caches must be float16 (n_ctx, n_kv, D) holding rows start .. start+T-1")
    for name, x, heads in (("q", q, n_heads), ("k", k, n_kv), ("v", v, n_kv)):
        if x.dtype != torch.float32 or x.shape[1:] != (heads, d) or x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"rope_kv_rows: {name} must be float32 (T, heads, D) with contiguous heads")
    if rows is not None and (rows.shape != (t,) or rows.dtype != torch.int64):
        raise ValueError("rope_kv_rows: per-token rows must be a (T,) int64 tensor")
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty(t, n_heads, d, dtype=torch.float32, device=q.device)
    _rope_kv_kernel[(n_heads + n_kv, triton.cdiv(t, ROWS_BLOCK))](
        q, k, v, cos, sin, k_cache, v_cache, q_out if rows is None else rows.contiguous(), q_out,
        t, n_heads, 0 if rows is not None else start,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        D=d, NEOX=bool(neox), POS_PTR=rows is not None, BLOCK_T=ROWS_BLOCK, num_warps=4,
        **launch_args(pdl),
    )
    return q_out

