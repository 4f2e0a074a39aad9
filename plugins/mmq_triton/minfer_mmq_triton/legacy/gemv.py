"""Decode GEMV over the legacy 32-value types (q4_0, q4_1, q5_0, q5_1, q8_0): ``y = x @ W.T (+ b)``.

Reads a :class:`~minfer_mmq_triton.legacy.plane.LegacyPlane` (16-byte aligned quant bytes, separate
f16 scales). One program owns ``BN`` output rows and walks the whole row, ``BB`` blocks a step;
program axis 1 is the activation row (decode: one).

Integer-to-float without a conversion instruction: a quant field ``u`` of ``b`` bits is OR-ed
into the top of a float32 mantissa, giving ``v = 1 + u / 2**b`` exactly (two integer ops, no
I2F). Per block the kernel sums ``S = sum(v * x)`` and ``X = sum(x)``, and
``sum(w * x) = A * S + B * X`` with ``A, B`` from the block's scale (see ``_coefs``). The ``- X``
cancellation costs a few float32 ulps of ``S``: relative error stays near 1e-6.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter_gemv, gemv_launch_args
from ..launch.prologue import load_x
from ..launch.split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from .plane import LegacyPlane

ONE = tl.constexpr(0x3F800000)  # float32 1.0: exponent bits the quant field is OR-ed under

#: kernel type ids
TYPE_IDS = {"q4_0": 0, "q4_1": 1, "q5_0": 2, "q5_1": 3, "q8_0": 4}


@triton.jit
def _gemv_legacy_kernel(
    # pointers
    x_ptr, qs_ptr, qh_ptr, d_ptr, m_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    # sizes and strides (elements)
    N, NB, stride_xm, stride_ym, stride_bm, n_blocks,
    # meta
    QT: tl.constexpr, QB: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
    BN: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr,
    PF: tl.constexpr, SWIGLU: tl.constexpr,
):
    """x (M, K) f32, plane of N rows x NB blocks (QB quant bytes each) -> y (M, N) f32.
    SWIGLU: x is ``[g | u]`` (``launch.prologue``). Grid (cdiv(N, BN), SPLIT, M)."""
    pid, s_id, xm, rows, r = program_rows(N, BN)
    rb = r * NB  # first block of each row
    g = tl.arange(0, BB)
    i = tl.arange(0, QB)
    x_row = x_ptr + xm * stride_xm
    acc = tl.zeros([BN, BB], dtype=tl.float32)
    lo, hi = split_range(NB, s_id, SPLIT, BB)
    enter_gemv(PDL, qs_ptr, rb * QB, lo * QB, hi * QB, PF)
    K = NB * 32
    for kb in range(lo, hi, BB):
        blk = kb + g
        bmask = blk < hi
        # -- quant bytes [BN, BB, QB] and the matching activations [BB, QB]
        qp = qs_ptr + (rb * QB)[:, None, None] + (blk * QB)[None, :, None] + i[None, None, :]
        if EVEN:
            q = tl.load(qp).to(tl.int32)
        else:
            q = tl.load(qp, mask=bmask[None, :, None], other=0).to(tl.int32)
        xo = (blk * 32)[:, None] + i[None, :]
        if EVEN:
            x_lo = load_x(x_row, xo, K, None, SWIGLU)
        else:
            x_lo = load_x(x_row, xo, K, bmask[:, None], SWIGLU)
        if QT == 4:
            # q8_0: u = q + 128 in the top 8 mantissa bits; w = d * (256 v - 384)
            v = ((q << 15) ^ 0x3FC00000).to(tl.float32, bitcast=True)
            s = tl.sum(v * x_lo[None, :, :], axis=2)
            xs = tl.sum(x_lo, axis=1)
        else:
            if EVEN:
                x_hi = load_x(x_row, xo + 16, K, None, SWIGLU)
            else:
                x_hi = load_x(x_row, xo + 16, K, bmask[:, None], SWIGLU)
            if QT < 2:  # 4-bit: v = 1 + n / 16
                v_lo = (((q << 19) & 0x780000) | ONE).to(tl.float32, bitcast=True)
                v_hi = (((q << 15) & 0x780000) | ONE).to(tl.float32, bitcast=True)
            else:  # 5-bit: the high bit of value j is bit j of qh; v = 1 + u / 32
                hp = qh_ptr + rb[:, None] + blk[None, :]
                if EVEN:
                    qh = tl.load(hp)
                else:
                    qh = tl.load(hp, mask=bmask[None, :], other=0)
                qh = qh[:, :, None]
                v_lo = (((q << 18) & 0x3C0000) | (((qh >> i[None, None, :]) << 22) & 0x400000) | ONE
                        ).to(tl.float32, bitcast=True)
                v_hi = (((q << 14) & 0x3C0000) | (((qh >> (i[None, None, :] + 16)) << 22) & 0x400000) | ONE
                        ).to(tl.float32, bitcast=True)
            s = tl.sum(v_lo * x_lo[None, :, :] + v_hi * x_hi[None, :, :], axis=2)
            xs = tl.sum(x_lo + x_hi, axis=1)
        # -- block scales [BN, BB]
        sp = rb[:, None] + blk[None, :]
        if EVEN:
            d = tl.load(d_ptr + sp).to(tl.float32)
        else:
            d = tl.load(d_ptr + sp, mask=bmask[None, :], other=0.0).to(tl.float32)
        if QT == 0:
            a_coef = 16.0 * d
            b_coef = -24.0 * d
        elif QT == 2:
            a_coef = 32.0 * d
            b_coef = -48.0 * d
        elif QT == 4:
            a_coef = 256.0 * d
            b_coef = -384.0 * d
        else:
            if EVEN:
                mn = tl.load(m_ptr + sp).to(tl.float32)
            else:
                mn = tl.load(m_ptr + sp, mask=bmask[None, :], other=0.0).to(tl.float32)
            if QT == 1:
                a_coef = 16.0 * d
            else:
                a_coef = 32.0 * d
            b_coef = mn - a_coef
        acc += a_coef * s + b_coef * xs[None, :]
    y = tl.sum(acc, axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def gemv_legacy(x: torch.Tensor, plane: LegacyPlane, type_name: str, bias: torch.Tensor | None,
                bn: int, bb: int, num_warps: int, split: int = 1,
                scratch: SplitScratch | None = None, residual: torch.Tensor | None = None,
                pdl: bool = False, prefetch: int = 0, swiglu: bool = False) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` contiguous rows -> float32 ``(M, N)`` (plus ``residual``); with
    ``swiglu`` x is ``(M, 2K)`` ``[g | u]`` and the product is of ``silu(g) * u``."""
    n, nb = plane.d.shape
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    qh = plane.qh if plane.qh is not None else plane.d
    mn = plane.m if plane.m is not None else plane.d
    scratch = scratch or SplitScratch(n, bn, split)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    _gemv_legacy_kernel[(scratch.n_blocks, split, m)](
        x, plane.qs, qh, plane.d, mn, b, y, part, cnt,
        n, nb, x.stride(0), y.stride(0), sbm, scratch.n_blocks,
        QT=TYPE_IDS[type_name], QB=plane.qs.shape[1] // nb, HAS_BIAS=has_bias, SWIGLU=swiglu,
        EVEN=whole_steps(nb, bb, split), BN=bn, BB=bb, SPLIT=split, num_warps=num_warps,
        **gemv_launch_args(pdl, prefetch),
    )
    return y
