"""The int8 decode GEMVs' activation quantizer (fused RMSNorm or SwiGLU first), and ``dp4a``.

The activation row is quantized once per call (``_quant_x_kernel``) to two int8 digits per
value: per 32-value block (256 with ``rows``) ``s = max|x| / 127``, ``h = round(x / s)``,
``l = round(256 (x/s - h))``, so ``x = s (h + l / 256)`` to about 2^-16 of the block's largest
value (float32-grade for a dot product; a single int8 digit, as llama.cpp uses, would be 2^-8).
The kernel also keeps the exact float sums of every 16 values for the min / offset terms.

``rows=True`` writes the layout of the batched step's GEMMs (``q4_k.gemm_mma``) instead: one scale
per 256-value block (the GEMMs sum a whole q4_K block in integers), stored as ``s / 256`` in a
``(K / 256, MP)`` table (a block's scale beside those of the other rows; ``MP``: M padded), the
exact integer sum of ``256 h + l`` over each 32 values in a ``(K / 32, MP)`` int32 table, and per
row and per 8 values four words, digit h's two then digit l's two.

On CPU tensors (the ``TRITON_INTERPRET=1`` tests) ``dp4a`` is emulated with the same integer
arithmetic; on CUDA tensors it is the PTX instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter, launch_args

QUANT_BLOCKS = 32  # 32-value blocks per quantizer program
#: The name of this layout (:func:`quantize_x` without ``rows``) among an activation's ``forms``: the
#: decode attention writes its output in it too (``ops.attention``), for the GEMVs that read it.
FORM = "mmq.q8x2"
#: :data:`FORM`'s layout of ``silu(g) * u`` for an activation ``[g | u]`` (what :func:`quantize_x` with
#: ``swiglu`` writes): the gate|up GEMV writes it beside its product (``q4_k.gemv_mma``'s GLU), for the down
#: projection's GEMV.
GLU_FORM = "mmq.q8x2.glu"


@triton.jit
def dp4a(a, b, USE_ASM: tl.constexpr):
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
def two_digits(x, amax):
    """x [B, 2, 16] float32 (B blocks of 32 values), amax [B] the scale's max |x| -> the digits h, l
    (float32 holding integers in int8 range): ``x = amax / 127 (h + l / 256)`` to about 2^-16 of amax."""
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    t = x * inv[:, None, None]
    h = tl.floor(t + 0.5)
    lo = tl.floor((t - h) * 256.0 + 0.5)  # t - h in [-0.5, 0.5): lo in [-128, 128]
    carry = lo > 127.5  # 128 -> h + 1, -128 (|t| <= 127, so h stays within int8)
    return tl.where(carry, h + 1.0, h), tl.where(carry, lo - 256.0, lo)


@triton.jit
def store_blocks(x, b, bmask, m, K, xh_ptr, xl_ptr, xs_ptr, x16_ptr):
    """Quantize and store blocks ``b`` [B] of row ``m`` (values x [B, 2, 16], masked by ``bmask``) in
    the GEMVs' layout (:func:`quantize_x` without ``rows``)."""
    amax = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
    h, lo = two_digits(x, amax)
    off = (b * 32)[:, None, None] + (tl.arange(0, 2) * 16)[None, :, None] + tl.arange(0, 16)[None, None, :]
    tl.store(xh_ptr + m * K + off, h.to(tl.int8), mask=bmask[:, None, None])
    tl.store(xl_ptr + m * K + off, lo.to(tl.int8), mask=bmask[:, None, None])
    tl.store(xs_ptr + m * (K // 32) + b, amax / 127.0, mask=bmask)
    s16 = (b * 2)[:, None] + tl.arange(0, 2)[None, :]
    tl.store(x16_ptr + m * (K // 16) + s16, tl.sum(x, axis=2), mask=bmask[:, None])


@triton.jit
def _quant_x_kernel(x_ptr, nw_ptr, xh_ptr, xl_ptr, xs_ptr, x16_ptr, K, stride_xm, eps, MP,
                    QB: tl.constexpr, PRO: tl.constexpr, NRB: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr):
    """x (M, K) f32 -> xh, xl int8 (M, K); xs f32 (M, K/32) block scales; x16 f32 (M, K/16) sums
    (ROWS: the batched GEMMs' tables, see :func:`quantize_x`; ``MP``: their row stride).

    PRO (the fused prologue): 0 none; 1 RMSNorm, ``x * rsqrt(mean(x^2) + eps) * nw`` (each program
    sums the squares of the whole row, ``NRB`` chunks of ``32 QB`` values); 2 SwiGLU of a (M, 2K) row
    ``[g | u]``: ``silu(g) * u``.
    """
    m = tl.program_id(0)
    b = tl.program_id(1) * QB + tl.arange(0, QB)
    bmask = b < K // 32
    off = (b * 32)[:, None, None] + (tl.arange(0, 2) * 16)[None, :, None] + tl.arange(0, 16)[None, None, :]
    if PRO == 1:  # the norm's weights: no kernel writes them, so they load before the wait
        nw = tl.load(nw_ptr + off, mask=bmask[:, None, None], other=0.0)
    enter(PDL)
    row = x_ptr + m * stride_xm
    if PRO == 1:
        # the row in NRB chunks of a program's RB = 32 QB values, unrolled so that every load goes out at
        # once (one L2 round trip after the wait); chunk program_id(1) is this program's blocks
        RB: tl.constexpr = 32 * QB
        sq = tl.zeros([RB], dtype=tl.float32)
        for i in tl.static_range(NRB):
            r = i * RB + tl.arange(0, RB)
            v = tl.load(row + r, mask=r < K, other=0.0)
            sq += v * v
            if i == 0:
                own = v
            else:
                own = tl.where(tl.program_id(1) == i, v, own)
        rs = tl.rsqrt(tl.sum(sq, axis=0) / K + eps)
        x = tl.reshape(own, [QB, 2, 16]) * rs * nw
    else:
        x = tl.load(row + off, mask=bmask[:, None, None], other=0.0)
    if PRO == 2:
        u = tl.load(row + K + off, mask=bmask[:, None, None], other=0.0)
        x = x * tl.sigmoid(x) * u
    if ROWS:  # one scale per 256 values: the largest of its eight 32-value blocks
        # xh_ptr: (M, K / 8, 16) bytes, h of the 8 values then their l; xs_ptr: (K / 256, MP);
        # x16_ptr: (K / 32, MP) int32 sums of 256 h + l
        a256 = tl.max(tl.reshape(tl.max(tl.max(tl.abs(x), axis=2), axis=1), [QB // 8, 8]), axis=1)
        h, lo = two_digits(x, tl.reshape(tl.broadcast_to(a256[:, None], [QB // 8, 8]), [QB]))
        v = (tl.arange(0, 2) * 16)[None, :, None] + tl.arange(0, 16)[None, None, :]
        at = m * (2 * K) + (b * 64)[:, None, None] + (v // 8) * 16 + v % 8
        tl.store(xh_ptr + at, h.to(tl.int8), mask=bmask[:, None, None])
        tl.store(xh_ptr + at + 8, lo.to(tl.int8), mask=bmask[:, None, None])
        b8 = tl.program_id(1) * (QB // 8) + tl.arange(0, QB // 8)
        tl.store(xs_ptr + b8 * MP + m, a256 / (127.0 * 256.0), mask=b8 < K // 256)
        isum = tl.sum(tl.sum(h * 256.0 + lo, axis=2), axis=1)  # |isum| <= 32 * 32767: exact in float32
        tl.store(x16_ptr + b * MP + m, isum.to(tl.int32), mask=bmask)
    else:
        store_blocks(x, b, bmask, m, K, xh_ptr, xl_ptr, xs_ptr, x16_ptr)


def quantize_x(x: torch.Tensor, norm: tuple | None = None, swiglu: bool = False,
               pdl: bool = False, rows: bool = False, pad: int = 16) -> tuple[torch.Tensor, ...]:
    """x float32 ``(M, K)`` -> (xh int32 words, xl int32 words, block scales, 16-value sums), or
    with ``rows`` (the batched GEMMs' layout, see the module docstring; K a multiple of 256) (digit
    words (M, K / 2), 256-value block scales (K / 256, MP), 32-value integer sums (K / 32, MP)),
    ``MP`` = M rounded up to a multiple of ``pad`` (the table entries past M are left unset).

    ``norm=(w, eps)``: quantize ``rmsnorm(x) * w`` instead; ``swiglu``: x is ``(M, 2K)`` ``[g | u]``
    and ``silu(g) * u`` is quantized (the decode step's elementwise ops, fused here)."""
    m, k = x.shape
    if swiglu:
        k //= 2
    mp = m
    if rows:
        assert k % 256 == 0, f"the rows layout quantizes per 256 values; K = {k}"
        mp = -(-m // pad) * pad
        xh = xl = torch.empty(m, 2 * k, dtype=torch.int8, device=x.device)
        xs = torch.empty(k // 256, mp, dtype=torch.float32, device=x.device)
        x16 = torch.empty(k // 32, mp, dtype=torch.int32, device=x.device)
    else:
        xh, xl, xs, x16 = form_buffers(m, k, x.device)
    pro = 1 if norm is not None else 2 if swiglu else 0
    nw, eps = norm if norm is not None else (x, 0.0)
    _quant_x_kernel[(m, triton.cdiv(k // 32, QUANT_BLOCKS))](x, nw, xh, xl, xs, x16, k, x.stride(0), float(eps), mp,
                                                            QB=QUANT_BLOCKS, PRO=pro,
                                                            NRB=triton.cdiv(k, 32 * QUANT_BLOCKS) if pro == 1 else 0,
                                                            ROWS=rows,
                                                            num_warps=4, **launch_args(pdl))
    if rows:
        return xh.view(torch.int32), xs, x16
    return as_words(xh, xl, xs, x16)


def form_buffers(m: int, k: int, device) -> tuple[torch.Tensor, ...]:
    """Empty ``(xh, xl, xs, x16)`` of :data:`FORM` for ``m`` rows of ``k`` values (int8, int8,
    float32 block scales, float32 16-value sums)."""
    return (torch.empty(m, k, dtype=torch.int8, device=device), torch.empty(m, k, dtype=torch.int8, device=device),
            torch.empty(m, k // 32, dtype=torch.float32, device=device),
            torch.empty(m, k // 16, dtype=torch.float32, device=device))


def as_words(xh: torch.Tensor, xl: torch.Tensor, xs: torch.Tensor, x16: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:data:`FORM`'s buffers as the GEMVs take them (the digits as int32 words, what
    :func:`quantize_x` returns)."""
    return xh.view(torch.int32), xl.view(torch.int32), xs, x16
