"""Decode GEMV over q5_K and q6_K: ``y = x @ W.T (+ b)``, 256-value super-blocks (q4_K reads its
plane instead: ``gemv_q4plane``).

q5_K is read straight from the GGUF rows (``weight.raw``): its blocks are 176 bytes, so every
field starts 16-byte aligned and the quant bytes load 16 at a time. The packed
6-bit scales/mins are decoded in the kernel from three 32-bit words. q6_K blocks (210 bytes) are
read from the aligned :class:`~minfer_mmq_triton.gemv_pack.Q6KDecodePlane` (same bytes).

Tiles: one program owns ``BN`` output rows; a step covers ``BB`` super-blocks, split into
``G = 4 * BB`` groups (q5_K: a 64-value chunk, whose low nibbles are one 32-value sub-block
and high nibbles the next; q6_K: a (128-half, 16-byte run) pair). Partial sums per (row, group)
stay in registers and are scaled there; the row total is reduced once at the end.

Integer-to-float as in ``gemv_legacy``: a ``b``-bit field ``u`` OR-ed under the float32 exponent
of 1.0 is ``v = 1 + u / 2**b``; ``sum(u * x) = 2**b * (S - X)`` with ``S = sum(v x)``,
``X = sum(x)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv_pack import Q6KDecodePlane
from .gemv_prologue import load_x
from .gemv_split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from .pdl import enter_gemv, gemv_launch_args

ONE = tl.constexpr(0x3F800000)  # float32 1.0
TS = tl.constexpr(176)  # q5_K block bytes
QS = tl.constexpr(48)  # offset of the quant bytes in a q5_K block


@triton.jit
def _f16_lo(w):
    """The float16 in the low half of int32 ``w``, as float32."""
    return (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale_min(h1, h2, h3, j):
    """6-bit scale and min of sub-block ``j`` (0..7) from the 12 packed bytes as words h1, h2, h3."""
    sh = (j % 4) * 8
    a = (h1 >> sh) & 0xFF  # byte j % 4 of bytes 0..3
    b = (h2 >> sh) & 0xFF  # bytes 4..7
    c = (h3 >> sh) & 0xFF  # bytes 8..11
    low = j < 4
    sc = tl.where(low, a & 63, (c & 15) | ((a >> 6) << 4))
    mn = tl.where(low, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _gemv_q5k_kernel(
    # pointers: x, raw rows as bytes and as int32 words, bias, y
    x_ptr, w8_ptr, w32_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    # sizes and strides (elements)
    N, NB, stride_xm, stride_ym, stride_bm, n_blocks,
    # meta
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, DEQ: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr, PF: tl.constexpr, SWIGLU: tl.constexpr,
):
    """q5_K rows (TS = 176-byte blocks: d, dmin, 12 scale bytes, qh at 16, qs at QS = 48).
    DEQ: dequantize each value with one FMA into a [BN, G, 32] accumulator (no per-step sums)
    instead of scaling per-group sums. Grid (cdiv(N, BN), M)."""
    G: tl.constexpr = 4 * BB
    pid, s_id, xm, rows, r = program_rows(N, BN)
    rb = r * NB  # first block of each row
    g = tl.arange(0, G)
    c = g % 4  # 64-value chunk within the block
    gb = g // 4  # block within the step
    b = tl.arange(0, 32)
    x_row = x_ptr + xm * stride_xm
    if DEQ:
        acc = tl.zeros([BN, G, 32], dtype=tl.float32)
    else:
        acc = tl.zeros([BN, G], dtype=tl.float32)
    lo, hi = split_range(NB, s_id, SPLIT, BB)
    enter_gemv(PDL, w8_ptr, rb * TS, lo * TS, hi * TS, PF)
    K = NB * 256
    for kb in range(lo, hi, BB):
        blk = kb + gb  # [G]
        gmask = blk < hi
        # -- quant bytes [BN, G, 32]: byte b of chunk c holds values 64c+b (low) and 64c+32+b (high)
        qp = w8_ptr + (rb * TS)[:, None, None] + (blk * TS + QS + c * 32)[None, :, None] + b[None, None, :]
        xo = (blk * 256 + c * 64)[:, None] + b[None, :]
        if EVEN:
            q = tl.load(qp).to(tl.int32)
            x_lo = load_x(x_row, xo, K, None, SWIGLU)
            x_hi = load_x(x_row, xo + 32, K, None, SWIGLU)
        else:
            q = tl.load(qp, mask=gmask[None, :, None], other=0).to(tl.int32)
            x_lo = load_x(x_row, xo, K, gmask[:, None], SWIGLU)
            x_hi = load_x(x_row, xo + 32, K, gmask[:, None], SWIGLU)
        # bit 2c (low) / 2c+1 (high) of qh[b] is the fifth bit; v = 1 + u / 32
        hp = w8_ptr + (rb * TS)[:, None, None] + (blk * TS + 16)[None, :, None] + b[None, None, :]
        if EVEN:
            qh = tl.load(hp).to(tl.int32)
        else:
            qh = tl.load(hp, mask=gmask[None, :, None], other=0).to(tl.int32)
        qh = qh >> (2 * c)[None, :, None]
        v_lo = (((q << 18) & 0x3C0000) | ((qh << 22) & 0x400000) | ONE).to(tl.float32, bitcast=True)
        v_hi = (((q << 14) & 0x3C0000) | ((qh << 21) & 0x400000) | ONE).to(tl.float32, bitcast=True)
        # -- block header as words: d|dmin, then the 12 scale bytes
        hw = w32_ptr + (rb * (TS // 4))[:, None] + (blk * (TS // 4))[None, :]
        if EVEN:
            w0 = tl.load(hw)
            h1 = tl.load(hw + 1)
            h2 = tl.load(hw + 2)
            h3 = tl.load(hw + 3)
        else:
            w0 = tl.load(hw, mask=gmask[None, :], other=0)
            h1 = tl.load(hw + 1, mask=gmask[None, :], other=0)
            h2 = tl.load(hw + 2, mask=gmask[None, :], other=0)
            h3 = tl.load(hw + 3, mask=gmask[None, :], other=0)
        d = _f16_lo(w0)
        dmin = _f16_lo(w0 >> 16)
        j = 2 * c[None, :]
        sc_lo, mn_lo = _k_scale_min(h1, h2, h3, j)
        sc_hi, mn_hi = _k_scale_min(h1, h2, h3, j + 1)
        a_lo = (32.0 * d) * sc_lo
        a_hi = (32.0 * d) * sc_hi
        if DEQ:  # w = a v - (a + dmin m)
            w_lo = v_lo * a_lo[:, :, None] - (a_lo + dmin * mn_lo)[:, :, None]
            w_hi = v_hi * a_hi[:, :, None] - (a_hi + dmin * mn_hi)[:, :, None]
            acc += w_lo * x_lo[None, :, :]
            acc += w_hi * x_hi[None, :, :]
        else:
            s_lo = tl.sum(v_lo * x_lo[None, :, :], axis=2)  # [BN, G]
            s_hi = tl.sum(v_hi * x_hi[None, :, :], axis=2)
            x_slo = tl.sum(x_lo, axis=1)[None, :]
            x_shi = tl.sum(x_hi, axis=1)[None, :]
            acc += a_lo * (s_lo - x_slo) - (dmin * mn_lo) * x_slo
            acc += a_hi * (s_hi - x_shi) - (dmin * mn_hi) * x_shi
    if DEQ:
        y = tl.sum(tl.sum(acc, axis=2), axis=1)
    else:
        y = tl.sum(acc, axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


@triton.jit
def _gemv_q6k_kernel(
    x_ptr, w8_ptr, sc_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_xm, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, DEQ: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr, PF: tl.constexpr, SWIGLU: tl.constexpr,
):
    """q6_K over its decode plane (208-byte blocks ``ql | qh | scales`` + f16 ``d``).

    Group ``g`` = (block, half h, run s): bytes ``i < 16`` of ql at ``64h + 16s + i`` and
    ``64h + 32 + 16s + i``, qh at ``128 + 32h + 16s + i``, hold values ``128h + 32k + 16s + i``
    (k = 0..3) with scale ``scales[8h + 2k + s]``. DEQ as in ``_gemv_q5k_kernel``.
    """
    G: tl.constexpr = 4 * BB
    pid, s_id, xm, rows, r = program_rows(N, BN)
    rb = r * NB
    g = tl.arange(0, G)
    gb = g // 4
    h = (g // 2) % 2
    s = g % 2
    i = tl.arange(0, 16)
    x_row = x_ptr + xm * stride_xm
    if DEQ:
        acc = tl.zeros([BN, G, 16], dtype=tl.float32)
    else:
        acc = tl.zeros([BN, G], dtype=tl.float32)
    lo, hi = split_range(NB, s_id, SPLIT, BB)
    enter_gemv(PDL, w8_ptr, rb * 208, lo * 208, hi * 208, PF)
    K = NB * 256
    for kb in range(lo, hi, BB):
        blk = kb + gb
        gmask = blk < hi
        lp = w8_ptr + (rb * 208)[:, None, None] + (blk * 208 + h * 64 + s * 16)[None, :, None] + i[None, None, :]
        hp = w8_ptr + (rb * 208)[:, None, None] + (blk * 208 + 128 + h * 32 + s * 16)[None, :, None] + i[None, None, :]
        xo = (blk * 256 + h * 128 + s * 16)[:, None] + i[None, :]
        if EVEN:
            ql0 = tl.load(lp).to(tl.int32)
            ql1 = tl.load(lp + 32).to(tl.int32)
            qh = tl.load(hp).to(tl.int32)
            x0 = load_x(x_row, xo, K, None, SWIGLU)
            x1 = load_x(x_row, xo + 32, K, None, SWIGLU)
            x2 = load_x(x_row, xo + 64, K, None, SWIGLU)
            x3 = load_x(x_row, xo + 96, K, None, SWIGLU)
        else:
            m3 = gmask[None, :, None]
            m2 = gmask[:, None]
            ql0 = tl.load(lp, mask=m3, other=0).to(tl.int32)
            ql1 = tl.load(lp + 32, mask=m3, other=0).to(tl.int32)
            qh = tl.load(hp, mask=m3, other=0).to(tl.int32)
            x0 = load_x(x_row, xo, K, m2, SWIGLU)
            x1 = load_x(x_row, xo + 32, K, m2, SWIGLU)
            x2 = load_x(x_row, xo + 64, K, m2, SWIGLU)
            x3 = load_x(x_row, xo + 96, K, m2, SWIGLU)
        # 6-bit u at mantissa bits 17..22: v = 1 + u / 64, w = d * sc * (64 v - 96)
        v0 = (((ql0 << 17) & 0x1E0000) | ((qh << 21) & 0x600000) | ONE).to(tl.float32, bitcast=True)
        v1 = (((ql1 << 17) & 0x1E0000) | ((qh << 19) & 0x600000) | ONE).to(tl.float32, bitcast=True)
        v2 = (((ql0 << 13) & 0x1E0000) | ((qh << 17) & 0x600000) | ONE).to(tl.float32, bitcast=True)
        v3 = (((ql1 << 13) & 0x1E0000) | ((qh << 15) & 0x600000) | ONE).to(tl.float32, bitcast=True)
        sp = sc_ptr + (rb * 208)[:, None] + (blk * 208 + 192 + h * 8 + s)[None, :]
        dp = d_ptr + rb[:, None] + blk[None, :]
        if EVEN:
            sc0 = tl.load(sp).to(tl.float32)
            sc1 = tl.load(sp + 2).to(tl.float32)
            sc2 = tl.load(sp + 4).to(tl.float32)
            sc3 = tl.load(sp + 6).to(tl.float32)
            d = tl.load(dp).to(tl.float32)
        else:
            m2r = gmask[None, :]
            sc0 = tl.load(sp, mask=m2r, other=0).to(tl.float32)
            sc1 = tl.load(sp + 2, mask=m2r, other=0).to(tl.float32)
            sc2 = tl.load(sp + 4, mask=m2r, other=0).to(tl.float32)
            sc3 = tl.load(sp + 6, mask=m2r, other=0).to(tl.float32)
            d = tl.load(dp, mask=m2r, other=0.0).to(tl.float32)
        if DEQ:  # w = a (v - 1.5), a = 64 d sc
            a0 = (64.0 * d * sc0)[:, :, None]
            a1 = (64.0 * d * sc1)[:, :, None]
            a2 = (64.0 * d * sc2)[:, :, None]
            a3 = (64.0 * d * sc3)[:, :, None]
            acc += (v0 * a0 - 1.5 * a0) * x0[None, :, :]
            acc += (v1 * a1 - 1.5 * a1) * x1[None, :, :]
            acc += (v2 * a2 - 1.5 * a2) * x2[None, :, :]
            acc += (v3 * a3 - 1.5 * a3) * x3[None, :, :]
        else:
            t0 = 64.0 * tl.sum(v0 * x0[None, :, :], axis=2) - 96.0 * tl.sum(x0, axis=1)[None, :]
            t1 = 64.0 * tl.sum(v1 * x1[None, :, :], axis=2) - 96.0 * tl.sum(x1, axis=1)[None, :]
            t2 = 64.0 * tl.sum(v2 * x2[None, :, :], axis=2) - 96.0 * tl.sum(x2, axis=1)[None, :]
            t3 = 64.0 * tl.sum(v3 * x3[None, :, :], axis=2) - 96.0 * tl.sum(x3, axis=1)[None, :]
            acc += d * (sc0 * t0 + sc1 * t1 + sc2 * t2 + sc3 * t3)
    if DEQ:
        y = tl.sum(tl.sum(acc, axis=2), axis=1)
    else:
        y = tl.sum(acc, axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def gemv_q5k(x: torch.Tensor, raw: torch.Tensor, bias: torch.Tensor | None,
              bn: int, bb: int, num_warps: int, deq: bool = False, split: int = 1,
              scratch: SplitScratch | None = None, residual: torch.Tensor | None = None,
              pdl: bool = False, prefetch: int = 0, swiglu: bool = False) -> torch.Tensor:
    """q5_K raw rows ``(N, NB * 176)`` uint8; ``x`` float32 ``(M, K)`` -> float32 ``(M, N)``
    (plus ``residual`` ``(M, N)`` when given); ``swiglu``: x is ``(M, 2K)`` ``[g | u]`` (``gemv_prologue``)."""
    n = raw.shape[0]
    nb = raw.shape[1] // 176
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    scratch = scratch or SplitScratch(n, bn, split)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    _gemv_q5k_kernel[(scratch.n_blocks, split, m)](
        x, raw, raw.view(torch.int32), b, y, part, cnt,
        n, nb, x.stride(0), y.stride(0), sbm, scratch.n_blocks, SWIGLU=swiglu,
        HAS_BIAS=has_bias, EVEN=whole_steps(nb, bb, split), BN=bn, BB=bb, DEQ=deq, SPLIT=split, num_warps=num_warps,
        **gemv_launch_args(pdl, prefetch),
    )
    return y


def gemv_q6k(x: torch.Tensor, plane: Q6KDecodePlane, bias: torch.Tensor | None,
             bn: int, bb: int, num_warps: int, deq: bool = False, split: int = 1,
             scratch: SplitScratch | None = None, residual: torch.Tensor | None = None,
             pdl: bool = False, prefetch: int = 0, swiglu: bool = False) -> torch.Tensor:
    """q6_K decode plane; ``x`` float32 ``(M, K)`` -> float32 ``(M, N)`` (plus ``residual``);
    ``swiglu`` as in :func:`gemv_q5k`."""
    n, nb = plane.d.shape
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    scratch = scratch or SplitScratch(n, bn, split)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    _gemv_q6k_kernel[(scratch.n_blocks, split, m)](
        x, plane.w, plane.w.view(torch.int8), plane.d, b, y, part, cnt,
        n, nb, x.stride(0), y.stride(0), sbm, scratch.n_blocks, SWIGLU=swiglu,
        HAS_BIAS=has_bias, EVEN=whole_steps(nb, bb, split), BN=bn, BB=bb, DEQ=deq, SPLIT=split,
        num_warps=num_warps, **gemv_launch_args(pdl, prefetch),
    )
    return y
