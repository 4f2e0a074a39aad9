"""Decode GEMV over q6_K with integer dot products (``dp4a``: four 8-bit products per instruction),
for the large matrices, where the float kernel runs out of instruction issue before memory.

x is quantized once per call to two int8 digits per value (``ops.quant_x``). The weights' quant
fields are unpacked four per 32-bit word into byte lanes and multiplied with ``h`` and ``l`` words;
the integer sums of each 16-value sub-block are scaled once in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter_gemv, gemv_launch_args
from ..launch.split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from ..ops.quant_x import dp4a, quantize_x
from .plane import DECODE_BYTES, QH_AT, SC_AT

WB = tl.constexpr(DECODE_BYTES)  # bytes of a block in the decode plane
WW = tl.constexpr(DECODE_BYTES // 4)  # its 32-bit words
QH_W = tl.constexpr(QH_AT // 4)  # word of qh in a block
SC = tl.constexpr(SC_AT)  # byte offset of the int8 scales


@triton.jit
def _gemv_q6k_i8_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, sc_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
    SPLIT: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr, PF: tl.constexpr,
):
    """q6_K decode plane as int32 words (WW per block: ql 0..31, qh from QH_W (32..47), scales 48..51).

    Group g = (block, half h); for quarter k, run s (16 values), word w4 < 4:
    ql word ``16h + 8(k % 2) + 4s + w4`` nibble ``k // 2``, qh word ``QH_W + 8h + 4s + w4`` bits 2k,
    values ``128h + 32k + 16s + 4 w4 + t``, scale ``scales[8h + 2k + s]``.
    """
    G: tl.constexpr = 2 * BB
    pid, s_id, xm, rows, r = program_rows(N, BN)
    rb = r * NB
    g = tl.arange(0, G)
    h = g % 2
    gb = g // 2
    sr = tl.arange(0, 2)
    w4 = tl.arange(0, 4)
    KW = NB * 64
    xh_row = xh_ptr + xm * KW
    xl_row = xl_ptr + xm * KW
    acc = tl.zeros([BN, G, 2], dtype=tl.float32)
    lo_b, hi_b = split_range(NB, s_id, SPLIT, BB)
    enter_gemv(PDL, w32_ptr, rb * WB, lo_b * WB, hi_b * WB, PF)
    for kb in range(lo_b, hi_b, BB):
        blk = kb + gb
        g1 = blk < hi_b
        gm = g1[None, :, None]
        wb = (rb * WW)[:, None, None, None] + (blk * WW)[None, :, None, None] + (sr * 4)[None, None, :, None] \
            + w4[None, None, None, :]
        ql0 = tl.load(w32_ptr + wb + (h * 16)[None, :, None, None], mask=gm[:, :, :, None], other=0)
        ql1 = tl.load(w32_ptr + wb + (h * 16 + 8)[None, :, None, None], mask=gm[:, :, :, None], other=0)
        qh = tl.load(w32_ptr + wb + (h * 8 + QH_W)[None, :, None, None], mask=gm[:, :, :, None], other=0)
        d = tl.load(d_ptr + rb[:, None, None] + blk[None, :, None], mask=gm, other=0.0).to(tl.float32)
        for k in tl.static_range(4):
            if k % 2 == 0:
                ql = ql0
            else:
                ql = ql1
            u = ((ql >> (4 * (k // 2))) & 0x0F0F0F0F) | (((qh >> (2 * k)) & 0x03030303) << 4)
            xo = (blk * 64 + h * 32 + k * 8)[:, None, None] + (sr * 4)[None, :, None] + w4[None, None, :]
            xmask = g1[:, None, None]
            xh = tl.load(xh_row + xo, mask=xmask, other=0)
            xl = tl.load(xl_row + xo, mask=xmask, other=0)
            ih = tl.sum(dp4a(u, xh[None], USE_ASM), axis=3).to(tl.float32)  # [BN, G, 2]
            il = tl.sum(dp4a(u, xl[None], USE_ASM), axis=3).to(tl.float32)
            sb = xm * (NB * 8) + blk * 8 + h * 4 + k  # the 32-value x block
            xs = tl.load(xs_ptr + sb, mask=g1, other=0.0)[None, :, None]
            x16 = tl.load(x16_ptr + (2 * sb)[:, None] + sr[None, :], mask=g1[:, None], other=0.0)[None]
            sc = tl.load(sc_ptr + (rb * WB)[:, None, None] + (blk * WB + SC + h * 8 + 2 * k)[None, :, None]
                         + sr[None, None, :], mask=gm, other=0).to(tl.float32)
            acc += (d * sc) * ((ih + il * (1.0 / 256.0)) * xs - 32.0 * x16)
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def gemv_i8(x: torch.Tensor, data, bias: torch.Tensor | None, bn: int, bb: int,
            num_warps: int, split: int, scratch: SplitScratch, residual: torch.Tensor | None = None,
            norm: tuple | None = None, swiglu: bool = False, num_stages: int = 3,
            pdl: bool = False, prefetch: int = 0) -> torch.Tensor:
    """A q6_K decode plane; x float32 ``(M, K)`` -> ``(M, N)`` (q4_K: ``q4_k.gemv``).

    ``norm``/``swiglu``: see :func:`quantize_x`; ``residual`` ``(M, N)`` is added to the result."""
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl)
    m = x.shape[0]
    n, nb = data.d.shape
    w32 = data.w.view(torch.int32)
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    meta = dict(HAS_BIAS=has_bias, EVEN=whole_steps(nb, bb, split), BN=bn, BB=bb, SPLIT=split,
                USE_ASM=x.is_cuda, num_warps=num_warps, num_stages=num_stages,
                **gemv_launch_args(pdl, prefetch))
    grid = (scratch.n_blocks, split, m)
    _gemv_q6k_i8_kernel[grid](xh, xl, xs, x16, w32, data.w.view(torch.int8), data.d, b, y, part, cnt,
                              n, nb, y.stride(0), sbm, scratch.n_blocks, **meta)
    return y
