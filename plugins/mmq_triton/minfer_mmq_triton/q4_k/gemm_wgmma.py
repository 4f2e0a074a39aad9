"""The q4_K GEMM of few rows on Hopper's warpgroup MMA, weights decoded straight into its A registers.

``y (M, N) = a (M, K) @ dequant(W).T (+ bias)`` for a bf16 ``a`` of at most 256 rows. A program owns
64 weight rows (one warpgroup, the MMA's M) and every activation row (the MMA's N, ``NA`` wide, a
multiple of 8), and walks its share of K one 128-value span at a time: the span's 64 bytes a row
(``q4_k.plane``: byte ``p`` holds value ``p`` in its low nibble, ``64 + p`` in its high one) are
loaded 16 contiguous bytes a thread and row, decoded in bf16x2 arithmetic (three instructions a
value: the nibble masked into the mantissa of 128.0, 128 subtracted, one fma with the sub-block's
scale and negated min) into registers that *are* the wgmma's A fragment, and two ``wgmma`` (low
nibbles, high nibbles; K = 64 each) multiply them with the span's activations, staged in shared
memory. Nothing of the weight touches shared memory.

The A fragment of thread ``4 g + c`` holds, for K slice ``j`` (16 values), the values ``16 j + 2 c
+ {0, 1, 8, 9}``; the bytes it loads are ``16 c + 4 j + {0 .. 3}``. A value's place in K can be
any as long as the activations follow it, so the kernel takes logical K position
``k = 16 j + 8 h + 4 s + 2 c0 + e`` to mean byte ``p = 32 s + 16 c0 + 4 j + 2 h + e`` (``PERM``) and
gathers the activations in that order. A thread's 16 bytes of a row then lie in one 32-value
sub-block, which is why one scale and min serve all of them.

Rows keep their bits in any batch: an activation row is one column of the MMA, its K order fixed,
and the split-K (``SPLIT``, from the weight's shape by the caller) meets in a fixed order.

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
from ..launch.rows import _reduce_splits_kernel
from .plane import Q4KPlane


def _decode_ptx() -> str:
    """Four bytes of one sub-block (``$4``) -> their low-nibble values (``$0``, ``$1``) and high-nibble
    values (``$2``, ``$3``) as bf16x2; ``$5`` / ``$9``: the low nibbles' scale and negated min,
    ``$13`` / ``$17`` the high nibbles', each a bf16 pair (the other copies a pack passes are
    the same registers)."""
    lines = ["{", ".reg .b32 t<2>, u, mg;", "mov.b32 mg, 0x64006400;",
             "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;"]
    for i in range(4):
        if i == 2:
            lines += ["shr.b32 t0, t0, 4;", "shr.b32 t1, t1, 4;"]
        s, m = ("$5", "$9") if i < 2 else ("$13", "$17")
        lines += [f"and.b32 u, t{i % 2}, 0x000F000F;", "or.b32 u, u, mg;", "sub.rn.f16x2 u, u, mg;",
                  f"fma.rn.f16x2 ${i}, u, {s}, {m};"]
    return "\n".join(lines + ["}"])


_DECODE = gl.constexpr(_decode_ptx())
STAGE_BLOCK = 1024
_DECODE_ARGS = gl.constexpr("=r,=r,=r,=r,r," + ",".join(["r"] * 16))

#: Bytes of one span: (row, s, q), byte p = 32 s + q, q = 16 c0 + 4 j + 2 h + e. Registers: e, h, j
#: (16 contiguous bytes) and row + 8; lanes: c0, s (lane bits 0, 1: c = 2 s + c0), then g (rows);
#: warps: rows 16 and 32. The wgmma A fragment, K reordered by PERM.
BYTES = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [8, 0, 0]],
    lane_bases=[[0, 0, 16], [0, 1, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 2, 32]))


@gluon.jit
def _f16_pair(x):
    """float32 ``x`` rounded to float16, in both halves of an int32 (an f16x2 operand)."""
    h = x.to(gl.float16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return h | (h << 16)


@gluon.jit
def _span_words(t, qs_ptr, sc_ptr, dm_ptr, rb, sb, qb, n_rows, stride_qs, stride_sc, stride_dm):
    """Span ``t``'s bytes ``[64, 2, 32]`` and, ``[64, 2, 1]`` each, its block's ``d | dmin`` word and
    the low and high nibbles' ``sc | m << 8`` words, as loaded."""
    ok = rb < n_rows
    return (gl.load(qs_ptr + rb * stride_qs + t * 64 + sb * 32 + qb, mask=ok, other=0),
            gl.load(dm_ptr + rb * stride_dm + t // 2, mask=ok, other=0),
            gl.load(sc_ptr + rb * stride_sc + t * 4 + sb, mask=ok, other=0).to(gl.int32),
            gl.load(sc_ptr + rb * stride_sc + t * 4 + 2 + sb, mask=ok, other=0).to(gl.int32))


@gluon.jit
def _decode(words):
    """A span's words (:func:`_span_words`) -> its low- and high-nibble values, bf16 ``[64, 2, 32]``."""
    b, dmw, lo, hi = words
    d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = (dmw >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    ops = [_f16_pair(d * (lo & 0xFF).to(gl.float32)), _f16_pair(-dmin * ((lo >> 8) & 0xFF).to(gl.float32)),
           _f16_pair(d * (hi & 0xFF).to(gl.float32)), _f16_pair(-dmin * ((hi >> 8) & 0xFF).to(gl.float32))]
    return gl.inline_asm_elementwise(_DECODE, _DECODE_ARGS, [b] + [gl.broadcast(o, b)[0] for o in ops],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@triton.jit
def _stage_kernel(a_ptr, x_ptr, M, K, stride_a, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program ``(r, c)``: values ``c BLOCK ..`` of row ``r`` of the staged activations ``x`` (float16
    ``(NA, K)``, PERM order within each 64-value half span, float16's range, rows from M on zero)."""
    enter(PDL)
    r = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    q = k % 64  # logical position 16 j + 8 h + 4 s + 2 c0 + e within its half -> byte 32 s + 16 c0 + 4 j + 2 h + e
    src = k - q + 32 * ((q >> 2) & 1) + 16 * ((q >> 1) & 1) + 4 * (q >> 4) + 2 * ((q >> 3) & 1) + (q & 1)
    v = tl.load(a_ptr + r * stride_a + src, mask=(k < K) & (r < M), other=0.0).to(tl.float32)
    tl.store(x_ptr + r * K + k, tl.minimum(tl.maximum(v, -65504.0), 65504.0).to(tl.float16), mask=k < K)


@gluon.jit
def _to_fragment(v, A: gl.constexpr):
    """Decoded values ``[64, 2, 32]`` (byte order) -> the wgmma A tile ``[64, 64]`` (PERM order)."""
    v = gl.reshape(v, [64, 2, 2, 4, 2, 2])  # row, s, c0, j, h, e
    v = gl.permute(v, (0, 3, 4, 1, 2, 5))  # row, j, h, s, c0, e
    return gl.convert_layout(gl.reshape(v, [64, 64]), A, assert_trivial=True)


@gluon.jit
def _gemm_q4k_wgmma_kernel(x_ptr, qs_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, M, N, K,
                           stride_qs, stride_sc, stride_dm,
                           NA: gl.constexpr, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, PDL: gl.constexpr):
    """Grid ``(cdiv(N, 64), SPLIT)``. ``y``: ``(M, N)``, or with ``SPLIT > 1`` the partials ``(SPLIT,
    M, N)`` (bias added by the reduction)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NA, 16])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    w0 = gl.program_id(0) * 64
    spans = K // 128
    per = gl.cdiv(spans, SPLIT)
    first = gl.program_id(1) * per
    last = gl.minimum(first + per, spans)

    # this thread's bytes: weight rows rb, sub-block half sb, byte qb within it
    rb = w0 + gl.arange(0, 64, layout=gl.SliceLayout(1, gl.SliceLayout(2, BYTES)))[:, None, None]
    sb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, BYTES)))[None, :, None]
    qb = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, BYTES)))[None, None, :]
    # staged activations (_stage_kernel): row xm, position xk of a half span
    x_off = (gl.arange(0, NA, layout=gl.SliceLayout(1, XL))[:, None] * K
             + gl.arange(0, 64, layout=gl.SliceLayout(0, XL))[None, :])

    x_lo = gl.allocate_shared_memory(gl.float16, [NA, 64], XS)
    x_hi = gl.allocate_shared_memory(gl.float16, [NA, 64], XS)
    acc = gl.zeros([64, NA], gl.float32, layout=MMA)
    nxt = _span_words(gl.minimum(first, spans - 1), qs_ptr, sc_ptr, dm_ptr, rb, sb, qb, N, stride_qs, stride_sc,
                      stride_dm)  # weights: nothing an earlier kernel writes
    enter(PDL)
    for t in range(first, last):
        cur = _span_words(t, qs_ptr, sc_ptr, dm_ptr, rb, sb, qb, N, stride_qs, stride_sc, stride_dm)
        x_lo.store(gl.load(x_ptr + x_off + t * 128))
        x_hi.store(gl.load(x_ptr + x_off + t * 128 + 64))
        lo, hi = _decode(cur)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(_to_fragment(lo, A), x_lo.permute((1, 0)), acc)
        acc = warpgroup_mma(_to_fragment(hi, A), x_hi.permute((1, 0)), acc)

    wr = w0 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))[:, None]
    am = gl.arange(0, NA, layout=gl.SliceLayout(0, MMA))[None, :]
    ok = (wr < N) & (am < M)
    if SPLIT == 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + wr, mask=wr < N, other=0.0)
        gl.store(y_ptr + am * N + wr, acc, mask=ok)
    else:
        gl.store(y_ptr + gl.program_id(1) * M * N + am * N + wr, acc, mask=ok)


def gemm_q4k_wgmma(a: torch.Tensor, plane: Q4KPlane, bias: torch.Tensor | None, rows: int, split: int,
                   pdl: bool = False) -> torch.Tensor:
    """``a`` bf16 ``(M, K)`` (``M <= rows``) @ dequant(plane).T (+ bias) -> float32 ``(M, N)``; ``rows``:
    the MMA's N (a multiple of 8, at most 256; the bucket's row count, so the instruction does not
    depend on how many rows came), ``split``: split-K (from the weight's shape)."""
    m, k = a.shape
    assert a.dtype == torch.bfloat16 and a.stride(1) == 1 and k % 256 == 0 and m <= rows and rows % 8 == 0
    sc, dm = plane.scale_words()
    n = plane.qs.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=a.device)
    out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=a.device)
    b = bias if bias is not None else y
    x = torch.empty(rows, k, dtype=torch.float16, device=a.device)
    _stage_kernel[(rows, triton.cdiv(k, STAGE_BLOCK))](a, x, m, k, a.stride(0), BLOCK=STAGE_BLOCK, **launch_args(pdl))
    _gemm_q4k_wgmma_kernel[(triton.cdiv(n, 64), split)](
        x, plane.qs, sc, dm, b, out, m, n, k, plane.qs.stride(0), sc.stride(0), dm.stride(0),
        NA=rows, SPLIT=split, HAS_BIAS=bias is not None, num_warps=4, **launch_args(pdl))
    if split > 1:
        block = 1024
        _reduce_splits_kernel[(triton.cdiv(m * n, block),)](out, b, y, y, m, n, SPLIT=split,
                                                             HAS_BIAS=bias is not None, HAS_RES=False,
                                                             BLOCK=block, **launch_args(pdl))
    return y
