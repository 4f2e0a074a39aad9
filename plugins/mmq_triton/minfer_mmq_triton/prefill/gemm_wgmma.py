"""q4_K / q6_K GEMMs of few rows on Hopper's warpgroup MMA, weights decoded straight into its A registers.

``y (M, N) = a (M, K) @ dequant(W).T (+ bias)`` over a plane (``q4_k.plane``, ``q6_k.plane``) for a
bf16 ``a`` of at most 256 rows. A first small kernel stages ``a`` once a call: float16, K reordered
(PERM, below), rows padded to ``NA``. The GEMM's program owns 64 weight rows (one warpgroup, the MMA's
M) and every activation row (the MMA's N), and walks its share of K one 128-value span at a time: the
span's 64 nibble bytes a row (byte ``p`` holds value ``p`` in its low nibble, ``64 + p`` in its high
one; q6_K adds a 2-bit field a value from its ``qh`` plane) are loaded 16 contiguous bytes a thread
and row, decoded in f16x2 arithmetic (the 4- or 6-bit ``q`` put in the mantissa of 1024.0, then one
subtraction and one fma or multiply with the sub-block's scale) into registers that *are* the wgmma's
A fragment, and two ``wgmma`` (low nibbles, high nibbles; K = 64 each) multiply them with the span's
activations, copied to shared memory. The weights never touch shared memory.

The A fragment of thread ``4 g + c`` holds, for K slice ``j`` (16 values), the values ``16 j + 2 c +
{0, 1, 8, 9}``; the bytes it loads are ``16 c + 4 j + {0 .. 3}``. A value's place in K can be any as
long as the activations follow it, so logical position ``k = 16 j + 8 h + 4 s + 2 c0 + e`` (``c = 2 s
+ c0``) stands for byte ``p = 32 s + 16 c0 + 4 j + 2 h + e`` (PERM). A thread's 16 bytes of a row then
are one run of 16 values, inside one sub-block (q4_K: 32 values, q6_K: 16), which is why one scale
(q4_K: and one min) serves all of them.

float16 rather than bf16 operands: a q4_K value is ``q (d sc) - dmin m`` with both products rounded
once to float16 (2^-11) where bf16 (2^-9) made the batched engine's logits drift from the single
stream's (``test_gpu_batched_equals_single_stream_engine``); activations are clamped to float16's
range when staged. Rows keep their bits in any batch: an activation row is one column of the MMA,
its K order fixed, and the split-K (``SPLIT``, from the weight's shape by the caller) meets in a
fixed order.

Gluon, CUDA only (compute capability 9.0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from ..launch.pdl import enter, launch_args
from ..launch.rows import reduce_splits
from ..q4_k.plane import Q4KPlane
from ..tiles import gemm_glu_fits

STAGE_BLOCK = 1024  # values a program of the staging kernel


def _q4k_ptx() -> str:
    """Four q4_K bytes (``$4``; their low nibbles lie in one sub-block, their high nibbles in another)
    -> the low-nibble values (``$0``, ``$1``) and the high-nibble values (``$2``, ``$3``) as f16x2
    ``q s - m``: ``$5`` / ``$9`` the low nibbles' scale and negated min, ``$13`` / ``$17`` the high
    nibbles', each a float16 pair (the other copies a pack passes are the same registers)."""
    lines = ["{", ".reg .b32 t<2>, u, mg;", "mov.b32 mg, 0x64006400;",
             "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;"]
    for i in range(4):
        if i == 2:
            lines += ["shr.b32 t0, t0, 4;", "shr.b32 t1, t1, 4;"]
        s, m = ("$5", "$9") if i < 2 else ("$13", "$17")
        lines += [f"and.b32 u, t{i % 2}, 0x000F000F;", "or.b32 u, u, mg;", "sub.rn.f16x2 u, u, mg;",
                  f"fma.rn.f16x2 ${i}, u, {s}, {m};"]
    return "\n".join(lines + ["}"])


def _q6k_ptx(scales: tuple[str, str] = ("$6", "$10"), shift: str = "$14") -> str:
    """Four q6_K ``ql`` bytes (``$4``) and their ``qh`` bytes (``$5``, shifted right by ``shift`` first:
    four times the span's half) -> the values of the low nibbles (``$0``, ``$1``; ``qh`` bits 0-1)
    and of the high nibbles (``$2``, ``$3``; bits 2-3) as f16x2 ``s (q - 32)``, with ``scales`` the
    two sub-blocks' float16 scale pairs. ``1024 + q`` minus 1056 is ``q - 32`` exactly."""
    lines = ["{", ".reg .b32 t<2>, g<2>, u, v, mg, mh, h;", "mov.b32 mg, 0x64006400;", "mov.b32 mh, 0x64206420;",
             f"shr.b32 h, $5, {shift};", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;",
             "prmt.b32 g0, h, 0, 0x4140;", "prmt.b32 g1, h, 0, 0x4342;"]
    for i in range(4):
        if i == 2:
            lines += ["shr.b32 t0, t0, 4;", "shr.b32 t1, t1, 4;"]
        lines += [f"and.b32 u, t{i % 2}, 0x000F000F;", f"shl.b32 v, g{i % 2}, {4 if i < 2 else 2};",
                  "and.b32 v, v, 0x00300030;", "or.b32 u, u, v;", "or.b32 u, u, mg;", "sub.rn.f16x2 u, u, mh;",
                  f"mul.rn.f16x2 ${i}, u, {scales[0] if i < 2 else scales[1]};"]
    return "\n".join(lines + ["}"])


_Q4K, _Q4K_ARGS = gl.constexpr(_q4k_ptx()), gl.constexpr("=r,=r,=r,=r,r," + ",".join(["r"] * 16))
_Q6K, _Q6K_ARGS = gl.constexpr(_q6k_ptx()), gl.constexpr("=r,=r,=r,=r,r,r," + ",".join(["r"] * 12))

#: A span's bytes of 64 rows as (row, s, c0, i), byte p = 32 s + 16 c0 + i. Registers: i (16
#: contiguous bytes) and row + 8; lanes: c0, s (c = 2 s + c0), then g (rows); warps: rows 16 and 32.
#: Reordered by PERM this is the wgmma A fragment (:func:`_to_fragment`).
BYTES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8], [8, 0, 0, 0]],
    lane_bases=[[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
    warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, 2, 2, 16]))


@gluon.jit
def _f16_pair(x):
    """``x`` rounded to float16, in both halves of an int32 (an f16x2 operand)."""
    h = x.to(gl.float16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return h | (h << 16)


@gluon.jit
def _span_words(t, w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, n_rows, stride0, stride1, stride2,
                WTYPE: gl.constexpr):
    """Span ``t``'s data of rows ``rb`` as loaded: q4_K its bytes ``[64, 2, 2, 16]``, its block's ``d |
    dmin`` word and the low and high nibbles' ``sc | m << 8`` words (``[64, 2, 1, 1]``); q6_K its
    ``ql`` and ``qh`` bytes and the low and high nibbles' float16 scales (``[64, 2, 2, 1]``)."""
    ok = rb < n_rows
    p = sb * 32 + cb * 16 + ib
    if WTYPE == 0:
        return (gl.load(w0_ptr + rb * stride0 + t * 64 + p, mask=ok, other=0),
                gl.load(w2_ptr + rb * stride2 + t // 2, mask=ok, other=0),
                gl.load(w1_ptr + rb * stride1 + t * 4 + sb, mask=ok, other=0).to(gl.int32),
                gl.load(w1_ptr + rb * stride1 + t * 4 + 2 + sb, mask=ok, other=0).to(gl.int32))
    else:
        sub = (t // 2) * 16 + (t % 2) * 8 + 2 * sb + cb  # 16-value sub-block of the low nibbles
        return (gl.load(w0_ptr + rb * stride0 + t * 64 + p, mask=ok, other=0),
                gl.load(w1_ptr + rb * stride1 + (t // 2) * 64 + p, mask=ok, other=0),
                gl.load(w2_ptr + rb * stride2 + sub, mask=ok, other=0).to(gl.int32) & 0xFFFF,
                gl.load(w2_ptr + rb * stride2 + sub + 4, mask=ok, other=0).to(gl.int32) & 0xFFFF)


@gluon.jit
def _q4k_scales(dmw, lo, hi, like):
    """A q4_K span's ``d | dmin`` word and its low and high nibbles' ``sc | m << 8`` words -> the four
    f16x2 operands of the decode (low scale, low negated min, high scale, high negated min), broadcast
    to ``like``'s shape."""
    d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = (dmw >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    ops = [_f16_pair(d * (lo & 0xFF).to(gl.float32)), _f16_pair(-dmin * ((lo >> 8) & 0xFF).to(gl.float32)),
           _f16_pair(d * (hi & 0xFF).to(gl.float32)), _f16_pair(-dmin * ((hi >> 8) & 0xFF).to(gl.float32))]
    return [gl.broadcast(o, like)[0] for o in ops]


@gluon.jit
def _decode(t, words, WTYPE: gl.constexpr):
    """Span ``t``'s words (:func:`_span_words`) -> its low- and high-nibble values, float16
    ``[64, 2, 2, 16]``."""
    if WTYPE == 0:
        b, dmw, lo, hi = words
        return gl.inline_asm_elementwise(_Q4K, _Q4K_ARGS, [b] + _q4k_scales(dmw, lo, hi, b),
                                         dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    else:
        ql, qh, s0, s1 = words
        shift = gl.full(ql.shape, 4, gl.int32, ql.type.layout) * (t % 2)
        return gl.inline_asm_elementwise(
            _Q6K, _Q6K_ARGS, [ql, qh, gl.broadcast(s0 | (s0 << 16), ql)[0], gl.broadcast(s1 | (s1 << 16), ql)[0],
                              shift], dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@triton.jit
def _stage_kernel(a_ptr, x_ptr, nw_ptr, M, K, stride_a, eps, BLOCK: tl.constexpr, PRO: tl.constexpr,
                  PERM: tl.constexpr, PDL: tl.constexpr):
    """Program ``(r, c)``: values ``c BLOCK ..`` of row ``r`` of the staged activations ``x`` (float16
    ``(NA, K)``, float16's range, rows from M on zero), in the order PERM says: 0 K's own, 1 PERM
    within each 64-value half span, 2 values ``4 w + 1`` and ``4 w + 2`` swapped.

    PRO, the producer applied first (the batched step's): 0 none; 1 RMSNorm, ``a * rsqrt(mean(a^2) +
    eps) * nw`` (each program sums the squares of the whole row); 2 SwiGLU of a ``(M, 2K)`` row
    ``[g | u]``: ``silu(g) * u``."""
    enter(PDL)
    r = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    src = k
    if PERM == 2:
        src = k + ((k & 3) == 1).to(tl.int32) - ((k & 3) == 2).to(tl.int32)
    if PERM == 1:
        q = k % 64  # logical position 16 j + 8 h + 4 s + 2 c0 + e -> byte 32 s + 16 c0 + 4 j + 2 h + e
        src = k - q + 32 * ((q >> 2) & 1) + 16 * ((q >> 1) & 1) + 4 * (q >> 4) + 2 * ((q >> 3) & 1) + (q & 1)
    row = a_ptr + r * stride_a
    lim = tl.where(r < M, K, 0)  # values to read from this row
    ok = k < lim
    v = tl.load(row + src, mask=ok, other=0.0).to(tl.float32)
    if PRO == 1:
        sq = tl.zeros([BLOCK], dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            i = k0 + tl.arange(0, BLOCK)
            u = tl.load(row + i, mask=i < lim, other=0.0).to(tl.float32)
            sq += u * u
        v = v * tl.rsqrt(tl.sum(sq, axis=0) / K + eps) * tl.load(nw_ptr + src, mask=k < K, other=0.0)
    if PRO == 2:
        v = v * tl.sigmoid(v) * tl.load(row + K + src, mask=ok, other=0.0).to(tl.float32)
    tl.store(x_ptr + r * K + k, tl.minimum(tl.maximum(v, -65504.0), 65504.0).to(tl.float16), mask=k < K)


@gluon.jit
def _to_fragment(v, A: gl.constexpr):
    """Decoded values ``[R, 2, 2, 16]`` (byte order) -> the wgmma A tile ``[R, 64]`` (PERM order)."""
    R: gl.constexpr = v.shape[0]
    v = gl.reshape(v, [R, 2, 2, 4, 2, 2])  # row, s, c0, j, h, e
    v = gl.permute(v, (0, 3, 4, 1, 2, 5))  # row, j, h, s, c0, e
    return gl.convert_layout(gl.reshape(v, [R, 64]), A, assert_trivial=True)


@gluon.jit
def _gemm_wgmma_kernel(x_ptr, w0_ptr, w1_ptr, w2_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride0, stride1,
                       stride2, NA: gl.constexpr, WTYPE: gl.constexpr, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr,
                       HAS_RES: gl.constexpr, PDL: gl.constexpr, GLU: gl.constexpr = False):
    """Grid ``(cdiv(N, 64), SPLIT)``; ``WTYPE`` 0: q4_K (``qs``, ``sc`` int16, ``dm`` int32), 1: q6_K
    (``ql``, ``qh``, ``sc`` as int16). ``y``: ``(M, N)`` (+ bias, + the residual ``(M, N)`` under
    HAS_RES), or with ``SPLIT > 1`` the partials ``(SPLIT, M, N)`` (bias and residual added by the
    reduction); under GLU (split 1, no bias or residual) ``silu(g) * u`` ``(M, N / 2)``, bf16
    (:func:`store_glu`)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NA, 16])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    w0 = gl.program_id(0) * 64
    spans = K // 128
    per = gl.cdiv(spans, SPLIT)
    first = gl.program_id(1) * per
    last = gl.minimum(first + per, spans)

    # this thread's bytes: weight rows rb, byte 32 sb + 16 cb + ib of the span
    L3: gl.constexpr = gl.SliceLayout(3, BYTES)
    rb = tile_rows(w0, gl.arange(0, 64, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))), N, GLU)[:, None, None, None]
    sb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None, None]
    cb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :, None]
    ib = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, BYTES))))[None, None, None, :]
    # staged activations (_stage_kernel): row, position of a half span
    x_off = (gl.arange(0, NA, layout=gl.SliceLayout(1, XL))[:, None] * K
             + gl.arange(0, 64, layout=gl.SliceLayout(0, XL))[None, :])

    x_lo = gl.allocate_shared_memory(gl.float16, [NA, 64], XS)
    x_hi = gl.allocate_shared_memory(gl.float16, [NA, 64], XS)
    acc = gl.zeros([64, NA], gl.float32, layout=MMA)
    enter(PDL)
    for t in range(first, last):
        words = _span_words(t, w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, N, stride0, stride1, stride2, WTYPE)
        x_lo.store(gl.load(x_ptr + x_off + t * 128))
        x_hi.store(gl.load(x_ptr + x_off + t * 128 + 64))
        lo, hi = _decode(t, words, WTYPE)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(_to_fragment(lo, A), x_lo.permute((1, 0)), acc)
        acc = warpgroup_mma(_to_fragment(hi, A), x_hi.permute((1, 0)), acc)

    store_tile(acc, w0, 0, gl.program_id(1), bias_ptr, res_ptr, y_ptr, M, N, SPLIT, HAS_BIAS, HAS_RES, GLU)


@gluon.jit
def store_tile(acc, w0, a0, part, bias_ptr, res_ptr, y_ptr, M, N, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr,
               HAS_RES: gl.constexpr, GLU: gl.constexpr):
    """A tile's sums ``acc`` (weight rows from ``w0``, activation rows from ``a0``) into ``y`` ``(M, N)``
    (+ bias, + the residual), or with ``SPLIT > 1`` into split ``part`` of the partials ``(SPLIT, M,
    N)``; under GLU ``silu(g) * u`` (:func:`store_glu`)."""
    if GLU:
        store_glu(acc, w0, a0, y_ptr, M, N // 2)
    else:
        L: gl.constexpr = acc.type.layout
        wr = w0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, L))[:, None]
        am = a0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, L))[None, :]
        _store(acc, wr, am, part, bias_ptr, res_ptr, y_ptr, M, N, SPLIT, HAS_BIAS, HAS_RES)


@gluon.jit
def _store(acc, wr, am, part, bias_ptr, res_ptr, y_ptr, M, N, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr,
           HAS_RES: gl.constexpr):
    """Weight rows ``wr`` x activation rows ``am`` of the product into ``y`` ``(M, N)`` (+ bias, + the
    residual), or with ``SPLIT > 1`` into split ``part`` of the partials ``(SPLIT, M, N)``."""
    ok = (wr < N) & (am < M)
    if SPLIT == 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + wr, mask=wr < N, other=0.0)
        if HAS_RES:
            acc += gl.load(res_ptr + am * N + wr, mask=ok, other=0.0)
        gl.store(y_ptr + am * N + wr, acc, mask=ok)
    else:
        gl.store(y_ptr + part * M * N + am * N + wr, acc, mask=ok)


def gemm_wgmma(a: torch.Tensor, plane, bias: torch.Tensor | None, rows: int, split: int,
               pdl: bool = False, residual: torch.Tensor | None = None, norm: tuple | None = None,
               swiglu: bool = False, out_dtype: torch.dtype = torch.float32, glu: bool = False) -> torch.Tensor:
    """``[residual +] f(a) (M, K) @ dequant(plane).T (+ bias)`` -> ``(M, N)`` of ``out_dtype`` (float32 or
    bf16) for a q4_K or q6_K plane; ``a``: bf16 or float32, ``(M, 2K)`` with ``swiglu``; ``f`` the staging
    kernel's producer: RMSNorm with ``norm=(w, eps)`` (float32 ``w``), SwiGLU with ``swiglu``, else
    none. ``rows``: the MMA's N (a power of two from 8 to 256, at least M; the engine's row tile or
    group, so the instruction does not depend on how many rows came), ``split``: split-K (from the
    weight's shape); ``pdl``: every kernel (and the split reduction) launches with PDL
    (``launch.pdl``). ``glu`` (a ``[gate | up]`` plane, ``tiles.gemm_glu_fits``, no bias or residual): returns
    ``silu(g) * u`` of the product's halves ``(M, N / 2)``, bf16, instead of the product."""
    if norm is not None and swiglu:
        raise ValueError("the staging kernel applies RMSNorm or SwiGLU, not both")
    m, k = a.shape
    if swiglu:
        k //= 2
    assert a.dtype in (torch.bfloat16, torch.float32) and a.stride(1) == 1 and k % 256 == 0 and m <= rows
    assert rows in (8, 16, 32, 64, 128, 256)
    ws, wtype = plane_words(plane)
    n = ws[0].shape[0]
    y, out, b, res = glu_outputs(m, n, 64, split, bias, residual, a.device) if glu else \
        outputs(m, n, split, bias, residual, a.device, out_dtype)
    x = stage(a, rows, norm, swiglu, pdl)
    _gemm_wgmma_kernel[(triton.cdiv(n, 64), split)](
        x, *ws, b, res, out, m, n, k, *(w.stride(0) for w in ws), NA=rows, WTYPE=wtype, SPLIT=split,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None and split == 1, num_warps=4, GLU=glu,
        **launch_args(pdl))
    if split > 1:
        reduce_splits(out, bias, residual, y, pdl)
    return y


@gluon.jit
def tile_rows(w0, r, N, GLU: gl.constexpr):
    """Weight rows of a tile's rows ``r`` (``w0`` = 64 x the tile's warpgroups x its index). Under GLU (a
    ``[gate | up]`` weight of ``N`` rows) tile row ``16 w + 8 h + i`` is gate row (``h`` 0) or up row
    (``h`` 1) ``w0 / 2 + 8 w + i``: rows 8 apart in a warp's 16 are the halves the wgmma accumulator
    gives one thread, so each thread holds both inputs of its ``silu(g) * u``."""
    if GLU:
        return ((r // 8) % 2) * (N // 2) + w0 // 2 + (r // 16) * 8 + r % 8
    else:
        return w0 + r


@gluon.jit
def _glu_halves(t, h):
    """``t`` ``[R, NA]`` -> its tile rows with ``h`` 0 and with ``h`` 1 (``h``: row bit 3), each ``[R / 16,
    8, NA]`` in the order of :func:`tile_rows`; a sum over a thread's own registers, no exchange."""
    R: gl.constexpr = t.shape[0]
    NA: gl.constexpr = t.shape[1]
    t4 = gl.reshape(t, [R // 16, 2, 8, NA])
    h4 = gl.reshape(h, [R // 16, 2, 8, NA])
    return gl.sum(gl.where(h4 == 0, t4, 0), axis=1), gl.sum(gl.where(h4 == 1, t4, 0), axis=1)


@gluon.jit
def store_glu(acc, w0, a0, y_ptr, M, F):
    """A GLU tile's sums (:func:`tile_rows`) -> ``silu(g) * u`` of its ``R / 2`` features ``w0 / 2 ..`` for
    activation rows ``a0 ..``, bf16 into ``y`` ``(M, F)``."""
    R: gl.constexpr = acc.shape[0]
    NA: gl.constexpr = acc.shape[1]
    L: gl.constexpr = acc.type.layout
    zero = gl.zeros([R, NA], gl.int32, layout=L)
    r = gl.arange(0, R, layout=gl.SliceLayout(1, L))[:, None] + zero
    h = (r // 8) % 2
    g, u = _glu_halves(acc, h)
    f, _ = _glu_halves(w0 // 2 + (r // 16) * 8 + r % 8, h)
    am, _ = _glu_halves(a0 + gl.arange(0, NA, layout=gl.SliceLayout(0, L))[None, :] + zero, h)
    v = g / (1.0 + gl.exp(-g)) * u
    gl.store(y_ptr + am * F + f, v.to(gl.bfloat16), mask=(am < M) & (f < F))


def plane_words(plane) -> tuple[tuple[torch.Tensor, ...], int]:
    """What the kernels read of a plane, and its ``WTYPE``: q4_K ``(qs, sc, dm)`` 0, q6_K ``(ql, qh,
    sc as int16)`` 1."""
    if isinstance(plane, Q4KPlane):
        w1, w2 = plane.scale_words()
        return (plane.qs, w1, w2), 0
    return (plane.ql, plane.qh, plane.sc.view(torch.int16)), 1


def outputs(m: int, n: int, split: int, bias, residual, device, dtype=torch.float32):
    """``y`` ``(m, n)`` of ``dtype`` (float32, or bf16: the float32 sums rounded as they are stored);
    what the kernel writes (``y``, or the float32 ``(split, m, n)`` partials), and the bias and
    residual pointers it gets (``y`` where there is none, or where the split reduction adds them)."""
    y = torch.empty(m, n, dtype=dtype, device=device)
    if residual is not None:
        assert residual.shape == y.shape and residual.dtype == torch.float32 and residual.is_contiguous()
    out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=device)
    b = bias if bias is not None else y
    res = residual if residual is not None and split == 1 else y
    return y, out, b, res


def glu_outputs(m: int, n: int, rows: int, split: int, bias, residual, device):
    """:func:`outputs` for the GLU epilogue: ``silu(g) * u`` ``(m, n / 2)`` bf16, written by the kernel."""
    assert gemm_glu_fits(n, rows, split) and bias is None and residual is None, \
        "GLU: whole gate tiles, no split, bias or residual"
    y = torch.empty(m, n // 2, dtype=torch.bfloat16, device=device)
    return y, y, y, y


def stage(a: torch.Tensor, rows: int, norm: tuple | None = None, swiglu: bool = False,
          pdl: bool = False, perm: int = 1) -> torch.Tensor:
    """The GEMM's activations: float16 ``(rows, K)`` from ``a`` ``(M, K)`` (``(M, 2K)`` ``[g | u]`` with
    ``swiglu``), in the order ``perm`` says (``_stage_kernel``'s PERM: 1 PERM), RMSNorm (``norm=(w,
    eps)``) or SwiGLU applied first, rows from M on zero."""
    m, k = a.shape
    if swiglu:
        k //= 2
    x = torch.empty(rows, k, dtype=torch.float16, device=a.device)
    pro = 1 if norm is not None else 2 if swiglu else 0
    nw, eps = norm if norm is not None else (a, 0.0)
    _stage_kernel[(rows, triton.cdiv(k, STAGE_BLOCK))](a, x, nw, m, k, a.stride(0), float(eps), BLOCK=STAGE_BLOCK,
                                                       PRO=pro, PERM=int(perm), **launch_args(pdl))
    return x
