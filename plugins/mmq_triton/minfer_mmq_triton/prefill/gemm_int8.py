"""The plane family at few rows: int8 tensor-core GEMMs over the q4_K / q6_K planes.

The activation is quantized per 32 values to int8 (``quantize_rows``: a scale ``xs`` and the
quantized sum ``xsum`` per block); the weight's integers go to ``tl.dot`` as they are (q4_K
``q`` in 0..15, q6_K ``q - 32``), one scale group at a time, so every dot product is an exact
integer; floats enter only when a group's sum is scaled:

* q4_K (32-value groups): ``y += (d sc) xs * sum(q xq) - (dmin m) * xsum``
* q6_K (16-value groups, two per 32-value dot, the other half of x masked): ``y += sc xs * sum``

Why: the bf16 fused GEMM spends its time turning nibbles into bf16 tiles, once per row block;
here a weight byte costs a mask and a shift, and rows ride along in the dot's N dimension, so a
step of 1 to 64 sequences reads each weight once at close to the cost of one.

Batch invariance: a row's integer sums are exact and its float updates run in one fixed order
(K steps, then the split-K partials in split order), neither depending on the other rows, the
row block or the split's program order; the split count comes from the weight's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..q4_k.plane import Q4KPlane
from ..tiles import int8_gemm_tile, int8_split
from .gemm_planes import _scratch


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, sum_ptr, K, stride_x):
    """Row ``program_id(0)``, 32-value block ``program_id(1)``: int8 values, scale, quantized sum."""
    r = tl.program_id(0)
    b = tl.program_id(1)
    offs = b * 32 + tl.arange(0, 32)
    x = tl.load(x_ptr + r * stride_x + offs).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = amax / 127.0
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    v = x * inv
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(0.5 - v)).to(tl.int32)
    tl.store(q_ptr + r * K + offs, q.to(tl.int8))
    tl.store(s_ptr + r * (K // 32) + b, scale)
    tl.store(sum_ptr + r * (K // 32) + b, scale * tl.sum(q, axis=0).to(tl.float32))


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (M, K) float -> int8 (M, K), scales and quantized sums float32 (M, K // 32)."""
    m, k = x.shape
    assert k % 32 == 0 and x.stride(1) == 1
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    s = torch.empty(m, k // 32, dtype=torch.float32, device=x.device)
    xsum = torch.empty_like(s)
    if m:
        _quantize_rows_kernel[(m, k // 32)](x, q, s, xsum, k, x.stride(0), num_warps=1)
    return q, s, xsum


@triton.jit
def _x_block(xq_ptr, xs_ptr, xsum_ptr, rm, mask_m, K, g):
    """Group ``g`` (32 values) of rows ``rm``: int8 ``[32, BM]``, scale and sum ``[BM]``."""
    kk = tl.arange(0, 32)
    xq = tl.load(xq_ptr + rm[None, :] * K + g * 32 + kk[:, None], mask=mask_m[None, :], other=0)
    xs = tl.load(xs_ptr + rm * (K // 32) + g, mask=mask_m, other=0.0)
    xsum = tl.load(xsum_ptr + rm * (K // 32) + g, mask=mask_m, other=0.0)
    return xq, xs, xsum


@triton.jit
def _dot_i8(w, xq, DOT_F32: tl.constexpr):
    """Exact ``w @ xq`` of int8 ``[BN, 32]`` and ``[32, BM]`` as float32 (the CPU interpreter has no
    integer dot: float32 holds these sums exactly, below 2^24)."""
    if DOT_F32:
        return tl.dot(w.to(tl.float32), xq.to(tl.float32), input_precision="ieee")
    return tl.dot(w, xq, out_dtype=tl.int32).to(tl.float32)


@triton.jit
def _gemm_int8_kernel(
    xq_ptr, xs_ptr, xsum_ptr, p0_ptr, p1_ptr, p2_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    M, N, K,
    stride_p0, stride_p1, stride_p2, stride_ym,
    WTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    """``y = x @ W.T (+ bias)``; grid (N blocks, SPLIT, M blocks); WTYPE 0 = q4_K (p: qs, sc, dm),
    1 = q6_K (p: ql, qh, sc). Accumulates ``[BN, BM]`` (weight rows x activation rows)."""
    pid_n = tl.program_id(0)
    s_id = tl.program_id(1)
    pid_m = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = rn < N
    mask_m = rm < M
    rr = tl.minimum(rn, N - 1).to(tl.int64)  # out-of-range rows re-read the last, never stored
    r = rr[:, None]
    l32 = tl.arange(0, 32)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    spans = K // 128 if WTYPE == 0 else K // 256
    per = tl.cdiv(spans, SPLIT)
    lo = s_id * per
    hi = tl.minimum(lo + per, spans)
    if WTYPE == 0:
        for t in range(lo, hi):
            dmp = p2_ptr + rr * stride_p2 + (t // 2) * 2
            d = tl.load(dmp).to(tl.float32)
            dmin = tl.load(dmp + 1).to(tl.float32)
            for j in tl.static_range(2):
                b = tl.load(p0_ptr + r * stride_p0 + t * 64 + j * 32 + l32)
                for h in tl.static_range(2):
                    g = 4 * t + 2 * h + j  # values 128t + 64h + 32j .. + 31
                    q = ((b >> (4 * h)) & 0xF).to(tl.int8)
                    xq, xs, xsum = _x_block(xq_ptr, xs_ptr, xsum_ptr, rm, mask_m, K, g)
                    sc = tl.load(p1_ptr + rr * stride_p1 + g * 2).to(tl.float32)
                    mn = tl.load(p1_ptr + rr * stride_p1 + g * 2 + 1).to(tl.float32)
                    isum = _dot_i8(q, xq, DOT_F32)
                    acc += isum * ((d * sc)[:, None] * xs[None, :]) - (dmin * mn)[:, None] * xsum[None, :]
    else:
        half = (l32 < 16).to(tl.int8)  # [1, 32]: the first 16-value group of a 32-value dot
        for t in range(lo, hi):
            for f in tl.static_range(4):  # values 256t + 64f .. + 63: ql half f // 2, nibble f % 2
                for j in tl.static_range(2):  # 32 of them: groups 16t + 4f + 2j and + 1
                    low = tl.load(p0_ptr + r * stride_p0 + t * 128 + (f // 2) * 64 + j * 32 + l32)
                    high = tl.load(p1_ptr + r * stride_p1 + t * 64 + j * 32 + l32)
                    q = (((low >> (4 * (f % 2))) & 0xF) | (((high >> (2 * f)) & 3) << 4)).to(tl.int8) - 32
                    g32 = 8 * t + 2 * f + j
                    xq, xs, xsum = _x_block(xq_ptr, xs_ptr, xsum_ptr, rm, mask_m, K, g32)
                    sc0 = tl.load(p2_ptr + rr * stride_p2 + 2 * g32).to(tl.float32)
                    sc1 = tl.load(p2_ptr + rr * stride_p2 + 2 * g32 + 1).to(tl.float32)
                    s0 = _dot_i8(q * half, xq, DOT_F32)
                    s1 = _dot_i8(q * (1 - half), xq, DOT_F32)
                    acc += s0 * (sc0[:, None] * xs[None, :]) + s1 * (sc1[:, None] * xs[None, :])
    mask = mask_n[:, None] & mask_m[None, :]
    y = y_ptr + rm[None, :] * stride_ym + rn[:, None]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=mask_n, other=0.0)[:, None]
        tl.store(y, acc, mask=mask)
    else:
        part = part_ptr + rm[None, :] * N + rn[:, None]
        tl.store(part + s_id * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tot = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for i in tl.static_range(1, SPLIT):
                tot += tl.load(part + i * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(bias_ptr + rn, mask=mask_n, other=0.0)[:, None]
            tl.store(y, tot, mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


def gemm_int8(x: torch.Tensor, plane, bias: torch.Tensor | None, config=None) -> torch.Tensor:
    """``x`` float32 or bf16 (M, K) @ dequant(plane).T (+ bias) -> float32 (M, N), through int8 dots.

    ``config``: ``(BLOCK_M, BLOCK_N, num_warps, SPLIT)``; by default ``tiles.int8_gemm_tile``
    for the row count and ``tiles.int8_split`` from the weight's shape alone.
    """
    m, k = x.shape
    assert k % 256 == 0
    if isinstance(plane, Q4KPlane):
        p0, p1, p2, wtype, span = plane.qs, plane.sc.view(plane.sc.shape[0], -1), plane.dm.view(
            plane.dm.shape[0], -1), 0, 128
    else:
        p0, p1, p2, wtype, span = plane.ql, plane.qh, plane.sc, 1, 256
    n = p0.shape[0]
    bm, bn, warps, *rest = config or int8_gemm_tile(m)
    split = rest[0] if rest else int8_split(n, k // span, bn)
    xq, xs, xsum = quantize_rows(x if x.stride(1) == 1 else x.contiguous())
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, bm))
    if split > 1:
        part, cnt = _scratch("part", split * m * n, x.device), _scratch("cnt", grid[0] * grid[2], x.device)
    else:
        part, cnt = y, y
    _gemm_int8_kernel[grid](
        xq, xs, xsum, p0, p1, p2, bias if bias is not None else y, y, part, cnt,
        m, n, k, p0.stride(0), p1.stride(0), p2.stride(0), y.stride(0),
        WTYPE=wtype, HAS_BIAS=bias is not None, DOT_F32=not x.is_cuda,
        BLOCK_M=bm, BLOCK_N=bn, SPLIT=split, num_warps=warps)
    return y
