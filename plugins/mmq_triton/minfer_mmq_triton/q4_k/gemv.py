"""Decode GEMVs over the q4_K plane (:class:`~minfer_mmq_triton.q4_k.plane.Q4KPlane`), the same
bytes the prefill GEMMs expand, so a q4_K weight needs no raw blocks once its plane exists.

Row layout read here: span ``t`` (values ``128t .. 128t + 127``) is 64 bytes of ``qs``; byte
``32j + l`` (``j`` < 2, ``l`` < 32) holds value ``128t + 32j + l`` in its low nibble (sub-block
``4t + j``) and value ``128t + 64 + 32j + l`` in its high nibble (sub-block ``4t + 2 + j``).
Sub-block ``b``'s 6-bit scale and min are bytes ``2b``, ``2b + 1`` of the row's ``sc`` (read as
32-bit words, two sub-blocks each); block ``t // 2``'s ``d`` and ``dmin`` are one 32-bit word
of ``dm``. ``w = (d sc) q - (dmin m)``.

Two kernels, as for q6_K (``q6_k.gemv``, ``q6_k.gemv_i8``): float products for small matrices,
and int8 dot products (``dp4a``) over the two-digit int8 copy of x for large ones (x quantized by
``ops.quant_x.quantize_x``, which can also apply RMSNorm or SwiGLU first). A step covers ``S``
spans of ``BN`` rows; split-K and the store (bias or residual) as in ``launch.split``. Each step
requests its scale words together with its quant bytes, so a step waits for memory once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter_gemv, gemv_launch_args
from ..launch.prologue import load_x
from ..launch.split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from ..ops.quant_x import dp4a, quantize_x
from .plane import Q4KPlane


@triton.jit
def _scale_words(sc_ptr, dm_ptr, rb_sc, rb_dm, t, m2):
    """The 32-bit words holding spans ``t``'s scales, [BN, S] each: ``sc`` of the low and high
    halves and ``d | dmin`` (masked by ``m2``, or unmasked when it is None).

    ``sc_ptr`` is the row's ``sc`` bytes as int32 words: word ``2t`` holds ``sc, m`` of
    sub-blocks ``4t`` and ``4t + 1`` (bytes 0-1, 2-3), word ``2t + 1`` those of ``4t + 2``, ``4t + 3``.
    """
    p = sc_ptr + rb_sc[:, None] + (t * 2)[None, :]
    dw = dm_ptr + rb_dm[:, None] + (t // 2)[None, :]
    if m2 is None:
        w_lo, w_hi, w = tl.load(p), tl.load(p + 1), tl.load(dw)
    else:
        w_lo, w_hi, w = tl.load(p, mask=m2, other=0), tl.load(p + 1, mask=m2, other=0), tl.load(dw, mask=m2, other=0)
    return w_lo, w_hi, w


@triton.jit
def _scale_values(w_lo, w_hi, w, j):
    """``(d sc, dmin m)`` of the low (sub-block 4t + j) and high (4t + 2 + j) halves, [BN, S, 2]."""
    d = ((w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32))[:, :, None]
    dmin = (((w >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32))[:, :, None]
    sh = (j * 16)[None, None, :]
    s_lo = (w_lo[:, :, None] >> sh) & 0xFF
    m_lo = (w_lo[:, :, None] >> (sh + 8)) & 0xFF
    s_hi = (w_hi[:, :, None] >> sh) & 0xFF
    m_hi = (w_hi[:, :, None] >> (sh + 8)) & 0xFF
    return (d * s_lo.to(tl.float32), dmin * m_lo.to(tl.float32),
            d * s_hi.to(tl.float32), dmin * m_hi.to(tl.float32))


@triton.jit
def _q4_step(qw_ptr, sc_ptr, dm_ptr, r, NT, t, j, w, tm):
    """One step's weight data: quant words [BN, S, 2, 8] and scale words (masked by ``tm`` [S]
    unless it is None)."""
    qp = qw_ptr + (r * (NT * 16))[:, None, None, None] + (t * 16)[None, :, None, None] \
        + (j * 8)[None, None, :, None] + w[None, None, None, :]
    if tm is None:  # a whole step
        q = tl.load(qp)
        w_lo, w_hi, wd = _scale_words(sc_ptr, dm_ptr, r * (NT * 2), r * (NT // 2), t, None)
    else:
        q = tl.load(qp, mask=tm[None, :, None, None], other=0)
        w_lo, w_hi, wd = _scale_words(sc_ptr, dm_ptr, r * (NT * 2), r * (NT // 2), t, tm[None, :])
    return q, w_lo, w_hi, wd


@triton.jit
def _gemv_q4p_kernel(
    x_ptr, qs_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NT, stride_xm, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, S: tl.constexpr, SPLIT: tl.constexpr,
    PDL: tl.constexpr, PF: tl.constexpr, SWIGLU: tl.constexpr,
):
    """Float products; ``NT`` spans per row; SWIGLU: x is ``[g | u]`` (``launch.prologue``).
    Grid (cdiv(N, BN), SPLIT, M)."""
    pid, s_id, xm, rows, r = program_rows(N, BN)
    ts = tl.arange(0, S)
    j = tl.arange(0, 2)
    l = tl.arange(0, 32)
    x_row = x_ptr + xm * stride_xm
    acc = tl.zeros([BN, S, 2], dtype=tl.float32)
    lo, hi = split_range(NT, s_id, SPLIT, S)
    enter_gemv(PDL, qs_ptr, r * (NT * 64), lo * 64, hi * 64, PF)
    K = NT * 128
    for t0 in range(lo, hi, S):
        t = t0 + ts
        tm = t < hi
        qp = qs_ptr + (r * (NT * 64))[:, None, None, None] + (t * 64)[None, :, None, None] \
            + (j * 32)[None, None, :, None] + l[None, None, None, :]
        xo = (t * 128)[:, None, None] + (j * 32)[None, :, None] + l[None, None, :]
        if EVEN:
            b = tl.load(qp).to(tl.int32)
            w_lo, w_hi, wd = _scale_words(sc_ptr, dm_ptr, r * (NT * 2), r * (NT // 2), t, None)
            x_lo = load_x(x_row, xo, K, None, SWIGLU)
            x_hi = load_x(x_row, xo + 64, K, None, SWIGLU)
        else:
            b = tl.load(qp, mask=tm[None, :, None, None], other=0).to(tl.int32)
            w_lo, w_hi, wd = _scale_words(sc_ptr, dm_ptr, r * (NT * 2), r * (NT // 2), t, tm[None, :])
            x_lo = load_x(x_row, xo, K, tm[:, None, None], SWIGLU)
            x_hi = load_x(x_row, xo + 64, K, tm[:, None, None], SWIGLU)
        s_lo = tl.sum((b & 0xF).to(tl.float32) * x_lo[None], axis=3)  # [BN, S, 2]
        s_hi = tl.sum((b >> 4).to(tl.float32) * x_hi[None], axis=3)
        a_lo, c_lo, a_hi, c_hi = _scale_values(w_lo, w_hi, wd, j)
        acc += a_lo * s_lo - c_lo * tl.sum(x_lo, axis=2)[None] + a_hi * s_hi - c_hi * tl.sum(x_hi, axis=2)[None]
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


@triton.jit
def _gemv_q4p_i8_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NT, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, S: tl.constexpr,
    SPLIT: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr, PF: tl.constexpr,
):
    """int8 dot products; ``qw`` is ``qs`` as int32 words (16 per span): word ``8j + w`` of span
    ``t`` holds values ``128t + 32j + 4w + (0..3)`` (low nibbles) and the same ``+ 64`` (high)."""
    pid, s_id, xm, rows, r = program_rows(N, BN)
    ts = tl.arange(0, S)
    j = tl.arange(0, 2)
    w = tl.arange(0, 8)
    KW = NT * 32  # x words per row
    xh_row = xh_ptr + xm * KW
    xl_row = xl_ptr + xm * KW
    acc = tl.zeros([BN, S, 2], dtype=tl.float32)
    lo, hi = split_range(NT, s_id, SPLIT, S)
    enter_gemv(PDL, qw_ptr, r * (NT * 64), lo * 64, hi * 64, PF)
    for t0 in range(lo, hi, S):
        t = t0 + ts
        tm = t < hi
        if EVEN:
            q, w_lo, w_hi, wd = _q4_step(qw_ptr, sc_ptr, dm_ptr, r, NT, t, j, w, None)
        else:
            q, w_lo, w_hi, wd = _q4_step(qw_ptr, sc_ptr, dm_ptr, r, NT, t, j, w, tm)
        xo = (t * 32)[:, None, None] + (j * 8)[None, :, None] + w[None, None, :]  # low half's x words
        sb = xm * (NT * 4) + (t * 4)[:, None] + j[None, :]  # x block of the low half (high: + 2)
        if EVEN:
            xh_lo, xh_hi = tl.load(xh_row + xo), tl.load(xh_row + xo + 16)
            xl_lo, xl_hi = tl.load(xl_row + xo), tl.load(xl_row + xo + 16)
            xs_lo, xs_hi = tl.load(xs_ptr + sb), tl.load(xs_ptr + sb + 2)
            xa_lo = tl.load(x16_ptr + 2 * sb) + tl.load(x16_ptr + 2 * sb + 1)
            xa_hi = tl.load(x16_ptr + 2 * sb + 4) + tl.load(x16_ptr + 2 * sb + 5)
        else:
            m3 = tm[:, None, None]
            m2 = tm[:, None]
            xh_lo = tl.load(xh_row + xo, mask=m3, other=0)
            xh_hi = tl.load(xh_row + xo + 16, mask=m3, other=0)
            xl_lo = tl.load(xl_row + xo, mask=m3, other=0)
            xl_hi = tl.load(xl_row + xo + 16, mask=m3, other=0)
            xs_lo = tl.load(xs_ptr + sb, mask=m2, other=0.0)
            xs_hi = tl.load(xs_ptr + sb + 2, mask=m2, other=0.0)
            xa_lo = tl.load(x16_ptr + 2 * sb, mask=m2, other=0.0) + tl.load(x16_ptr + 2 * sb + 1, mask=m2, other=0.0)
            xa_hi = tl.load(x16_ptr + 2 * sb + 4, mask=m2, other=0.0) + tl.load(x16_ptr + 2 * sb + 5, mask=m2, other=0.0)
        qlo = q & 0x0F0F0F0F
        qhi = (q >> 4) & 0x0F0F0F0F
        ih_lo = tl.sum(dp4a(qlo, xh_lo[None], USE_ASM), axis=3).to(tl.float32)  # [BN, S, 2]
        il_lo = tl.sum(dp4a(qlo, xl_lo[None], USE_ASM), axis=3).to(tl.float32)
        ih_hi = tl.sum(dp4a(qhi, xh_hi[None], USE_ASM), axis=3).to(tl.float32)
        il_hi = tl.sum(dp4a(qhi, xl_hi[None], USE_ASM), axis=3).to(tl.float32)
        a_lo, c_lo, a_hi, c_hi = _scale_values(w_lo, w_hi, wd, j)
        acc += a_lo * ((ih_lo + il_lo * (1.0 / 256.0)) * xs_lo[None]) - c_lo * xa_lo[None]
        acc += a_hi * ((ih_hi + il_hi * (1.0 / 256.0)) * xs_hi[None]) - c_hi * xa_hi[None]
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def gemv_q4p(x: torch.Tensor, plane: Q4KPlane, bias, bn: int, spans: int, num_warps: int, int8: bool,
             split: int, scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
             num_stages: int = 3, pdl: bool = False, prefetch: int = 0) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` (``(M, 2K)`` with ``swiglu``) -> float32 ``(M, N)``; ``norm`` (int8 only)
    and ``swiglu`` are applied where x is quantized (``int8``) or loaded (``launch.prologue``)."""
    n, half_k = plane.qs.shape
    nt = half_k // 64
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    grid = (scratch.n_blocks, split, m)
    meta = dict(HAS_BIAS=has_bias, EVEN=whole_steps(nt, spans, split), BN=bn, S=spans, SPLIT=split,
                num_warps=num_warps, num_stages=num_stages, **gemv_launch_args(pdl, prefetch))
    qw32, sc32, dm32 = plane.words()
    if int8:
        xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl)
        _gemv_q4p_i8_kernel[grid](xh, xl, xs, x16, qw32, sc32, dm32, b, y, part, cnt,
                                  n, nt, y.stride(0), sbm, scratch.n_blocks, USE_ASM=x.is_cuda, **meta)
    else:
        assert norm is None, "the float q4_K GEMV does not fuse RMSNorm"
        _gemv_q4p_kernel[grid](x, plane.qs, sc32, dm32, b, y, part, cnt,
                               n, nt, x.stride(0), y.stride(0), sbm, scratch.n_blocks, SWIGLU=swiglu, **meta)
    return y
