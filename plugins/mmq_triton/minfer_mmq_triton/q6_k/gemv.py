"""Decode GEMV over q6_K, float products: ``y = x @ W.T (+ b)``, reading the aligned
:class:`~minfer_mmq_triton.q6_k.plane.Q6KDecodePlane` (the raw blocks' bytes, ``d`` apart).

Tiles: one program owns ``BN`` output rows; a step covers ``BB`` blocks, split into ``G = 4 * BB``
groups (a (128-half, 16-byte run) pair). Partial sums per (row, group) stay in registers and are
scaled there; the row total is reduced once at the end.

Integer-to-float as in ``legacy.gemv``: a ``b``-bit field ``u`` OR-ed under the float32 exponent
of 1.0 is ``v = 1 + u / 2**b``; ``sum(u * x) = 2**b * (S - X)`` with ``S = sum(v x)``,
``X = sum(x)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter_gemv, gemv_launch_args
from ..launch.prologue import load_x
from ..launch.split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from .plane import DECODE_BYTES, QH_AT, SC_AT, Q6KDecodePlane

ONE = tl.constexpr(0x3F800000)  # float32 1.0
WB = tl.constexpr(DECODE_BYTES)  # bytes of a block in the decode plane
QH = tl.constexpr(QH_AT)  # offset of qh in a block
SC = tl.constexpr(SC_AT)  # offset of the int8 scales


@triton.jit
def _gemv_q6k_kernel(
    x_ptr, w8_ptr, sc_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_xm, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr, DEQ: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr, PF: tl.constexpr, SWIGLU: tl.constexpr,
):
    """q6_K over its decode plane (WB-byte blocks ``ql | qh | scales`` + f16 ``d``).

    Group ``g`` = (block, half h, run s): bytes ``i < 16`` of ql at ``64h + 16s + i`` and
    ``64h + 32 + 16s + i``, qh at ``QH + 32h + 16s + i``, hold values ``128h + 32k + 16s + i``
    (k = 0..3) with scale ``scales[8h + 2k + s]``. DEQ: dequantize each value with one FMA into a [BN, G, 16] accumulator instead of
    scaling per-group sums.
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
    enter_gemv(PDL, w8_ptr, rb * WB, lo * WB, hi * WB, PF)
    K = NB * 256
    for kb in range(lo, hi, BB):
        blk = kb + gb
        gmask = blk < hi
        lp = w8_ptr + (rb * WB)[:, None, None] + (blk * WB + h * 64 + s * 16)[None, :, None] + i[None, None, :]
        hp = w8_ptr + (rb * WB)[:, None, None] + (blk * WB + QH + h * 32 + s * 16)[None, :, None] + i[None, None, :]
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
        sp = sc_ptr + (rb * WB)[:, None] + (blk * WB + SC + h * 8 + s)[None, :]
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


def gemv_q6k(x: torch.Tensor, plane: Q6KDecodePlane, bias: torch.Tensor | None,
             bn: int, bb: int, num_warps: int, deq: bool = False, split: int = 1,
             scratch: SplitScratch | None = None, residual: torch.Tensor | None = None,
             pdl: bool = False, prefetch: int = 0, swiglu: bool = False) -> torch.Tensor:
    """q6_K decode plane; ``x`` float32 ``(M, K)`` -> float32 ``(M, N)`` (plus ``residual``);
    ``swiglu``: x is ``(M, 2K)`` ``[g | u]`` (``launch.prologue``)."""
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

