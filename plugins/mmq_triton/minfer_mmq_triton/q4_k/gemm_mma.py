"""The q4_K int8 GEMM of the batched step on tensor cores: activation rows as the MMA's N.

``mma.sync`` m16n8k32 (u8 x s8 -> s32) with 16 weight rows as A and 8 activation rows as B, one
MMA per (32-value sub-block, x digit). Each activation row's result is computed by the same
instructions in the same order whatever the other rows are, or how many (every sum is exact in
integers until a sub-block's float scaling, the split-K partials meet in a fixed order, and the
split comes from the weight's shape): a row's bits never depend on the batch.

Mapping (plane layout: ``q4_k.plane``; a span ``t`` is 16 words a row, value ``4 W + b`` of the
span in word ``W``'s low nibble ``b``, value ``64 + 4 W + b`` in its high nibble, so sub-block
``s`` of the span is words ``8 (s % 2) ..`` low (s < 2) or high (s >= 2)). Lane ``4 g + c`` of a
warp holds, of rows ``g`` and ``g + 8`` of a 16-row tile, words ``X = 8 j + 2 c`` and ``X + 1``
(``j`` = s % 2): sub-block values ``8 c .. 8 c + 7``, which fill the lane's A registers (k slots
``4 c ..`` from word X, ``16 + 4 c ..`` from word X + 1; any k order works when B uses the same).
B in lane ``4 g + c`` is activation row ``g`` of the group, the same eight values: one 16-byte
load of x's packed layout (``ops.quant_x``, ``rows=True``: per 8 values the two words of digit
h, then the two of digit l). The accumulator's element ``e`` of lane ``4 g + c`` is weight row
``g + 8 (e // 2)``, activation row ``2 c + e % 2``; ``256 h + l`` is exact in int32 and in
float32, then scaled by ``d * sc`` and the row's block scale, less ``dmin * m`` times the
sub-block's float sum of x.

Gluon, CUDA only (compute capability 8.0+).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch.mma import ax
from ..ops.quant_x import quantize_x
from .plane import Q4KPlane

_MMA_TAIL = """
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {h0, h1, h2, h3}, {a0, a1, a2, a3}, {$8, $9}, {z, z, z, z};
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {l0, l1, l2, l3}, {a0, a1, a2, a3}, {$10, $11}, {z, z, z, z};
mad.lo.s32 $0, h0, 256, l0; mad.lo.s32 $1, h1, 256, l1; mad.lo.s32 $2, h2, 256, l2; mad.lo.s32 $3, h3, 256, l3;
}"""
_MMA_LOW = gl.constexpr("""{
.reg .b32 a<4>, h<4>, l<4>, z;
mov.b32 z, 0;
and.b32 a0, $4, 0x0F0F0F0F; and.b32 a1, $6, 0x0F0F0F0F; and.b32 a2, $5, 0x0F0F0F0F; and.b32 a3, $7, 0x0F0F0F0F;
""" + _MMA_TAIL)
_MMA_HIGH = gl.constexpr("""{
.reg .b32 a<4>, h<4>, l<4>, t<4>, z;
mov.b32 z, 0;
shr.b32 t0, $4, 4; shr.b32 t1, $6, 4; shr.b32 t2, $5, 4; shr.b32 t3, $7, 4;
and.b32 a0, t0, 0x0F0F0F0F; and.b32 a1, t1, 0x0F0F0F0F; and.b32 a2, t2, 0x0F0F0F0F; and.b32 a3, t3, 0x0F0F0F0F;
""" + _MMA_TAIL)
_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 8))


@gluon.jit
def _sums(q, x, HIGH: gl.constexpr):
    """``256 h + l`` integer sums of a sub-block: A words ``q`` [..., 4] (row g: X, X + 1; row g + 8:
    X, X + 1), B words ``x`` [..., 4] (h, h, l, l) -> [..., 4] accumulator elements."""
    if HIGH:
        return gl.inline_asm_elementwise(_MMA_HIGH, _CONSTRAINTS, [q, x], dtype=gl.int32, is_pure=True, pack=4)
    else:
        return gl.inline_asm_elementwise(_MMA_LOW, _CONSTRAINTS, [q, x], dtype=gl.int32, is_pure=True, pack=4)


@gluon.jit
def _half(q, xq_ptr, x_off, xs_ptr, s_off, scw, d, dmin, sc_shift, t, M, HIGH: gl.constexpr):
    """The contribution of sub-blocks ``2 HIGH + j`` (j = 0, 1) of span ``t``: [W, T, G, 2, 8, 4, 4]."""
    xw = gl.load(xq_ptr + x_off + (t * 16 + 8 * HIGH) * 4)
    v = _sums(q, xw, HIGH).to(gl.float32)
    at = s_off + (t * 4 + 2 * HIGH) * M * 2
    xs = gl.load(xs_ptr + at)
    xa = gl.load(xs_ptr + at + 1)
    sc = ((scw >> sc_shift) & 0xFF).to(gl.float32)
    mn = ((scw >> (sc_shift + 8)) & 0xFF).to(gl.float32)
    return v * ((d * sc) * xs) - (dmin * mn) * xa


@gluon.jit
def _span(t, qw_ptr, q_off, dm_ptr, dm_off, sc_ptr, sc_off, sc_shift, xq_ptr, x_off, xs_ptr, s_off, M):
    """Span ``t``'s contribution to the accumulator [W, T, G, 2, 8, 4, 4]."""
    q = gl.load(qw_ptr + q_off + t * 16)
    dmw = gl.load(dm_ptr + dm_off + t // 2)
    d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = ((dmw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    lo = _half(q, xq_ptr, x_off, xs_ptr, s_off, gl.load(sc_ptr + sc_off + t * 2), d, dmin, sc_shift, t, M, False)
    hi = _half(q, xq_ptr, x_off, xs_ptr, s_off, gl.load(sc_ptr + sc_off + t * 2 + 1), d, dmin, sc_shift, t, M,
               True)
    return lo + hi


@gluon.jit
def _gemm_q4p_mma_kernel(xq_ptr, xs_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, res_ptr, y_ptr, M, N, NT,
                         HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, T: gl.constexpr, G: gl.constexpr,
                         SPLIT: gl.constexpr):
    """Grid (cdiv(M, 8 G), cdiv(N, 16 T num_warps), SPLIT): a program owns G groups of 8 activation
    rows, a warp T tiles of 16 weight rows, a split ``cdiv(NT, SPLIT)`` spans. ``y`` (M, N), or with
    SPLIT > 1 the partials (SPLIT, M, N) (bias and residual are then added by the reduction)."""
    W: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = 16 * T * W
    # axes [warp, tile, group, j, g, c, e]
    L: gl.constexpr = gl.BlockedLayout([1, T, G, 2, 1, 1, 4], [1, 1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1, 1],
                                       [6, 5, 4, 3, 2, 1, 0])
    LY: gl.constexpr = gl.SliceLayout(3, L)  # [W, T, G, 8, 4, 4]

    pid_m = gl.program_id(0)
    pid = gl.program_id(1)
    s_id = gl.program_id(2)
    aw, at, ag_, aj = ax(W, 0, 7, L), ax(T, 1, 7, L), ax(G, 2, 7, L), ax(2, 3, 7, L)
    ag, ac, ae = ax(8, 4, 7, L), ax(4, 5, 7, L), ax(4, 6, 7, L)
    # A: words 8 j + 2 c + e % 2 of row g + 8 (e // 2)
    row = gl.minimum(pid * BN + (aw * T + at) * 16 + ag + 8 * (ae // 2), N - 1).to(gl.int64)
    q_off = row * (NT * 16) + aj * 8 + ac * 2 + ae % 2
    # B: activation row g of the group, 8-value run c of sub-block j: words (t * 16 + 4 s + c) * 4 + e
    xrow = gl.minimum((pid_m * G + ag_) * 8 + ag, M - 1).to(gl.int64)
    x_off = xrow * (NT * 64) + (aj * 4 + ac) * 4 + ae
    # block scale and sum of x: (K / 32, M, 2) at sub-block t * 4 + s, activation row 2 c + e % 2
    xcol = gl.minimum((pid_m * G + ag_) * 8 + ac * 2 + ae % 2, M - 1)
    s_off = (aj * M + xcol) * 2
    # scale words: word 2 t + s // 2 of the row holds sub-blocks 4 t + s (s even: low 16 bits)
    sc_off = row * (NT * 2)
    sc_shift = aj * 16
    dm_off = row * (NT // 2)

    per = gl.cdiv(NT, SPLIT)
    lo = s_id * per
    hi = gl.minimum(lo + per, NT)
    acc = gl.zeros([W, T, G, 2, 8, 4, 4], gl.float32, layout=L)
    for t in range(lo, hi):
        acc += _span(t, qw_ptr, q_off, dm_ptr, dm_off, sc_ptr, sc_off, sc_shift, xq_ptr, x_off, xs_ptr, s_off, M)
    y = gl.sum(acc, axis=3)
    yw, yt, yg_ = ax(W, 0, 6, LY), ax(T, 1, 6, LY), ax(G, 2, 6, LY)
    yg, yc, ye = ax(8, 3, 6, LY), ax(4, 4, 6, LY), ax(4, 5, 6, LY)
    rows = pid * BN + (yw * T + yt) * 16 + yg + 8 * (ye // 2)
    cols = (pid_m * G + yg_) * 8 + yc * 2 + ye % 2
    mask = (rows < N) & (cols < M)
    out = cols.to(gl.int64) * N + rows
    if SPLIT == 1:
        if HAS_BIAS:
            y += gl.load(bias_ptr + rows, mask=mask, other=0.0)
        if HAS_RES:
            y += gl.load(res_ptr + out, mask=mask, other=0.0)
        gl.store(y_ptr + out, y, mask=mask)
    else:
        gl.store(y_ptr + s_id * M * N + out, y, mask=mask)


@triton.jit
def _reduce_splits_kernel(part_ptr, bias_ptr, res_ptr, y_ptr, M, N, SPLIT: tl.constexpr,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    """``y = sum_s part[s] (s = 0, 1, ... in order) + bias + residual`` over (M, N)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    y = tl.load(part_ptr + i, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        y += tl.load(part_ptr + s * M * N + i, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + i % N, mask=mask, other=0.0)
    if HAS_RES:
        y += tl.load(res_ptr + i, mask=mask, other=0.0)
    tl.store(y_ptr + i, y, mask=mask)


def gemm_q4p_mma(x: torch.Tensor, plane: Q4KPlane, bias, tiles: int, groups: int, num_warps: int, split: int,
                 residual=None, norm=None, swiglu: bool = False) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` (``(M, 2K)`` ``[g | u]`` with ``swiglu``) -> float32 ``(M, N)``
    ``= [residual +] f(x) @ W.T + bias``, ``f`` the optional RMSNorm (``norm=(w, eps)``) or SwiGLU
    applied by the quantizer. ``groups``: at most this many 8-row groups a program."""
    n, half_k = plane.qs.shape
    nt = half_k // 64
    m = x.shape[0]
    xq, xs = quantize_x(x, norm, swiglu, rows=True)
    qw32, sc32, dm32 = plane.words()
    groups = min(groups, triton.next_power_of_2(triton.cdiv(m, 8)))
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    if residual is not None:
        assert residual.shape == y.shape and residual.is_contiguous()
    b = bias if bias is not None else y
    r = residual if residual is not None else y
    grid = (triton.cdiv(m, 8 * groups), triton.cdiv(n, 16 * tiles * num_warps), split)
    _gemm_q4p_mma_kernel[grid](xq, xs, qw32, sc32, dm32, b, r, out, m, n, nt,
                               HAS_BIAS=bias is not None, HAS_RES=residual is not None, T=tiles, G=groups,
                               SPLIT=split, num_warps=num_warps)
    if split > 1:
        block = 1024
        _reduce_splits_kernel[(triton.cdiv(m * n, block),)](out, b, r, y, m, n, SPLIT=split,
                                                             HAS_BIAS=bias is not None,
                                                             HAS_RES=residual is not None, BLOCK=block)
    return y
