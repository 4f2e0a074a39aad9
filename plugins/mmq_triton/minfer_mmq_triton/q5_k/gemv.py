"""Decode GEMV over q5_K, float products: ``y = x @ W.T (+ b)``, read straight from the GGUF rows.

q5_K blocks are 176 bytes, so every field starts 16-byte aligned and the quant bytes load 16 at a
time; the packed 6-bit scales/mins are decoded in the kernel from three 32-bit words. Offsets come
from ``minfer_core.quants.BLOCK_FIELDS``.

Tiles: one program owns ``BN`` output rows; a step covers ``BB`` super-blocks, split into
``G = 4 * BB`` groups (a 64-value chunk, whose low nibbles are one 32-value sub-block and high
nibbles the next). Partial sums per (row, group) stay in registers and are scaled there; the row
total is reduced once at the end.

Integer-to-float as in ``legacy.gemv``: a ``b``-bit field ``u`` OR-ed under the float32 exponent
of 1.0 is ``v = 1 + u / 2**b``; ``sum(u * x) = 2**b * (S - X)`` with ``S = sum(v x)``,
``X = sum(x)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import field, info

from ..launch.pdl import enter_gemv, gemv_launch_args
from ..launch.prologue import load_x
from ..launch.split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps

BLOCK_BYTES = info(QT.Q5_K).type_size
ONE = tl.constexpr(0x3F800000)  # float32 1.0
TS = tl.constexpr(BLOCK_BYTES)  # q5_K block bytes
QS = tl.constexpr(field(QT.Q5_K, "qs")[0])  # offset of the quant bytes (low 4 bits)
QH = tl.constexpr(field(QT.Q5_K, "qh")[0])  # offset of the high bits
SC_WORD = tl.constexpr(field(QT.Q5_K, "scales")[0] // 4)  # 32-bit word of the 12 scale bytes (d|dmin: word 0)
assert field(QT.Q5_K, "d")[0] == 0 and field(QT.Q5_K, "dmin")[0] == 2


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
    """q5_K rows (TS-byte blocks: d, dmin, 12 scale bytes at word SC_WORD, qh at QH, qs at QS).
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
        hp = w8_ptr + (rb * TS)[:, None, None] + (blk * TS + QH)[None, :, None] + b[None, None, :]
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
            h1 = tl.load(hw + SC_WORD)
            h2 = tl.load(hw + SC_WORD + 1)
            h3 = tl.load(hw + SC_WORD + 2)
        else:
            w0 = tl.load(hw, mask=gmask[None, :], other=0)
            h1 = tl.load(hw + SC_WORD, mask=gmask[None, :], other=0)
            h2 = tl.load(hw + SC_WORD + 1, mask=gmask[None, :], other=0)
            h3 = tl.load(hw + SC_WORD + 2, mask=gmask[None, :], other=0)
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


def gemv_q5k(x: torch.Tensor, raw: torch.Tensor, bias: torch.Tensor | None,
              bn: int, bb: int, num_warps: int, deq: bool = False, split: int = 1,
              scratch: SplitScratch | None = None, residual: torch.Tensor | None = None,
              pdl: bool = False, prefetch: int = 0, swiglu: bool = False) -> torch.Tensor:
    """q5_K raw rows ``(N, NB * 176)`` uint8; ``x`` float32 ``(M, K)`` -> float32 ``(M, N)``
    (plus ``residual`` ``(M, N)`` when given); ``swiglu``: x is ``(M, 2K)`` ``[g | u]`` (``launch.prologue``)."""
    n = raw.shape[0]
    nb = raw.shape[1] // BLOCK_BYTES
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


