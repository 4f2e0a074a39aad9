"""Decode GEMV with integer dot products (``dp4a``: four 8-bit products per instruction) for the
large q6_K matrices, where the float kernels run out of instruction issue before memory, and
the activation quantizer that this kernel and the q4_K plane kernel (``gemv_q4plane``) share.

The activation row is quantized once per call (``_quant_x_kernel``) to two int8 digits per
value: per 32-value block ``s = max|x| / 127``, ``h = round(x / s)``, ``l = round(256 (x/s - h))``,
so ``x = s (h + l / 256)`` to about 2^-16 of the block's largest value (float32-grade for a
dot product; a single int8 digit, as llama.cpp uses, would be 2^-8). The kernel also keeps the
exact float sums of every 16 values for the min / offset terms. The weights' quant fields are
unpacked four per 32-bit word into byte lanes and multiplied with ``h`` and ``l`` words; the
integer sums of each 16/32-value sub-block are scaled once in float32.

On CPU tensors (the ``TRITON_INTERPRET=1`` tests) ``dp4a`` is emulated with the same integer
arithmetic; on CUDA tensors it is the PTX instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv_split import SplitScratch, bias_or_residual, program_rows, split_range, store_rows, whole_steps
from .pdl import enter, enter_gemv, gemv_launch_args, launch_args

QUANT_BLOCKS = 32  # 32-value blocks per quantizer program


@triton.jit
def _dp4a(a, b, USE_ASM: tl.constexpr):
    """Per 32-bit word: sum over its 4 bytes of unsigned ``a`` times signed ``b`` (int32)."""
    if USE_ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        r = (a & 0xFF) * ((b << 24) >> 24)
        r += ((a >> 8) & 0xFF) * ((b << 16) >> 24)
        r += ((a >> 16) & 0xFF) * ((b << 8) >> 24)
        r += ((a >> 24) & 0xFF) * (b >> 24)
        return r


@triton.jit
def _quant_x_kernel(x_ptr, nw_ptr, xh_ptr, xl_ptr, xs_ptr, x16_ptr, K, stride_xm, eps,
                    QB: tl.constexpr, PRO: tl.constexpr, RB: tl.constexpr, PDL: tl.constexpr):
    """x (M, K) f32 -> xh, xl int8 (M, K); xs f32 (M, K/32) block scales; x16 f32 (M, K/16) sums.

    PRO (the fused prologue): 0 none; 1 RMSNorm, ``x * rsqrt(mean(x^2) + eps) * nw`` (each program
    sums the squares of the whole row, RB values at a time); 2 SwiGLU of a (M, 2K) row
    ``[g | u]``: ``silu(g) * u``.
    """
    enter(PDL)
    m = tl.program_id(0)
    b = tl.program_id(1) * QB + tl.arange(0, QB)
    bmask = b < K // 32
    off = (b * 32)[:, None, None] + (tl.arange(0, 2) * 16)[None, :, None] + tl.arange(0, 16)[None, None, :]
    row = x_ptr + m * stride_xm
    x = tl.load(row + off, mask=bmask[:, None, None], other=0.0)
    if PRO == 1:
        sq = tl.zeros([RB], dtype=tl.float32)
        for k0 in range(0, K, RB):
            r = k0 + tl.arange(0, RB)
            v = tl.load(row + r, mask=r < K, other=0.0)
            sq += v * v
        rs = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
        x = x * rs * tl.load(nw_ptr + off, mask=bmask[:, None, None], other=0.0)
    if PRO == 2:
        u = tl.load(row + K + off, mask=bmask[:, None, None], other=0.0)
        x = x * tl.sigmoid(x) * u
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    t = x * inv[:, None, None]
    h = tl.floor(t + 0.5)
    lo = tl.floor((t - h) * 256.0 + 0.5)  # t - h in [-0.5, 0.5): lo in [-128, 128]
    carry = lo > 127.5  # 128 -> h + 1, -128 (|t| <= 127, so h stays within int8)
    h = tl.where(carry, h + 1.0, h)
    lo = tl.where(carry, lo - 256.0, lo)
    tl.store(xh_ptr + m * K + off, h.to(tl.int8), mask=bmask[:, None, None])
    tl.store(xl_ptr + m * K + off, lo.to(tl.int8), mask=bmask[:, None, None])
    tl.store(xs_ptr + m * (K // 32) + b, amax / 127.0, mask=bmask)
    s16 = (b * 2)[:, None] + tl.arange(0, 2)[None, :]
    tl.store(x16_ptr + m * (K // 16) + s16, tl.sum(x, axis=2), mask=bmask[:, None])


@triton.jit
def _gemv_q6k_i8_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, sc_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, BN: tl.constexpr, BB: tl.constexpr,
    SPLIT: tl.constexpr, USE_ASM: tl.constexpr, PDL: tl.constexpr, PF: tl.constexpr,
):
    """q6_K decode plane as int32 words (52 per block: ql 0..31, qh 32..47, scales 48..51).

    Group g = (block, half h); for quarter k, run s (16 values), word w4 < 4:
    ql word ``16h + 8(k % 2) + 4s + w4`` nibble ``k // 2``, qh word ``32 + 8h + 4s + w4`` bits 2k,
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
    enter_gemv(PDL, w32_ptr, rb * 208, lo_b * 208, hi_b * 208, PF)
    for kb in range(lo_b, hi_b, BB):
        blk = kb + gb
        g1 = blk < hi_b
        gm = g1[None, :, None]
        wb = (rb * 52)[:, None, None, None] + (blk * 52)[None, :, None, None] + (sr * 4)[None, None, :, None] \
            + w4[None, None, None, :]
        ql0 = tl.load(w32_ptr + wb + (h * 16)[None, :, None, None], mask=gm[:, :, :, None], other=0)
        ql1 = tl.load(w32_ptr + wb + (h * 16 + 8)[None, :, None, None], mask=gm[:, :, :, None], other=0)
        qh = tl.load(w32_ptr + wb + (32 + h * 8)[None, :, None, None], mask=gm[:, :, :, None], other=0)
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
            ih = tl.sum(_dp4a(u, xh[None], USE_ASM), axis=3).to(tl.float32)  # [BN, G, 2]
            il = tl.sum(_dp4a(u, xl[None], USE_ASM), axis=3).to(tl.float32)
            sb = xm * (NB * 8) + blk * 8 + h * 4 + k  # the 32-value x block
            xs = tl.load(xs_ptr + sb, mask=g1, other=0.0)[None, :, None]
            x16 = tl.load(x16_ptr + (2 * sb)[:, None] + sr[None, :], mask=g1[:, None], other=0.0)[None]
            sc = tl.load(sc_ptr + (rb * 208)[:, None, None] + (blk * 208 + 192 + h * 8 + 2 * k)[None, :, None]
                         + sr[None, None, :], mask=gm, other=0).to(tl.float32)
            acc += (d * sc) * ((ih + il * (1.0 / 256.0)) * xs - 32.0 * x16)
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def quantize_x(x: torch.Tensor, norm: tuple | None = None, swiglu: bool = False,
               pdl: bool = False) -> tuple[torch.Tensor, ...]:
    """x float32 ``(M, K)`` -> (xh int32 words, xl int32 words, block scales, 16-value sums).

    ``norm=(w, eps)``: quantize ``rmsnorm(x) * w`` instead; ``swiglu``: x is ``(M, 2K)`` ``[g | u]``
    and ``silu(g) * u`` is quantized (the decode step's elementwise ops, fused here)."""
    m, k = x.shape
    if swiglu:
        k //= 2
    xh = torch.empty(m, k, dtype=torch.int8, device=x.device)
    xl = torch.empty(m, k, dtype=torch.int8, device=x.device)
    xs = torch.empty(m, k // 32, dtype=torch.float32, device=x.device)
    x16 = torch.empty(m, k // 16, dtype=torch.float32, device=x.device)
    pro = 1 if norm is not None else 2 if swiglu else 0
    nw, eps = norm if norm is not None else (x, 0.0)
    _quant_x_kernel[(m, triton.cdiv(k // 32, QUANT_BLOCKS))](x, nw, xh, xl, xs, x16, k, x.stride(0), float(eps),
                                                            QB=QUANT_BLOCKS, PRO=pro, RB=1024, num_warps=4,
                                                            **launch_args(pdl))
    return xh.view(torch.int32), xl.view(torch.int32), xs, x16


def gemv_i8(x: torch.Tensor, data, bias: torch.Tensor | None, bn: int, bb: int,
            num_warps: int, split: int, scratch: SplitScratch, residual: torch.Tensor | None = None,
            norm: tuple | None = None, swiglu: bool = False, num_stages: int = 3,
            pdl: bool = False, prefetch: int = 0) -> torch.Tensor:
    """A q6_K decode plane; x float32 ``(M, K)`` -> ``(M, N)`` (q4_K: ``gemv_q4plane``).

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
