"""The q4_K int8 GEMM of the batched step on tensor cores: activation rows as the MMA's N.

``mma.sync`` m16n8k32 (u8 x s8 -> s32) with 16 weight rows as A and 8 activation rows as B. A
row's whole 256-value block is summed in integers before any float is touched: per 32-value
sub-block two MMAs (x's digits h and l) whose sums are multiplied by the sub-block's 6-bit scale
into two block sums H and L, and the sub-block's 6-bit min times x's integer sum over the
sub-block into a third, Hm (x quantized per block with its sub-block sums, ``ops.quant_x``,
``rows=True``). Once per block these meet the block's float scales: ``xs (d (256 H + L) - dmin Hm)``.
Every sum is exact in int32 (|H| <= 8 * 63 * 32 * 15 * 128 < 2^25, |Hm| <= 8 * 63 * 32 * 32767),
so each activation row's result is computed by the same instructions in the same order whatever
the other rows are, or how many; the split-K partials meet in a fixed order and the split comes
from the weight's shape: a row's bits never depend on the batch.

Mapping (plane layout: ``q4_k.plane``; a span ``t`` is 16 words a row, value ``4 W + b`` of the
span in word ``W``'s low nibble ``b``, value ``64 + 4 W + b`` in its high nibble, so sub-block
``s`` of the span is words ``8 (s % 2) ..`` low (s < 2) or high (s >= 2); spans ``2 b, 2 b + 1``
are block ``b``). Lane ``4 g + c`` of a warp holds, of rows ``g`` and ``g + 8`` of a 16-row tile,
words ``X = 8 (s % 2) + 2 c`` and ``X + 1``: sub-block values ``8 c .. 8 c + 7``, which fill the
lane's A registers (k slots ``4 c ..`` from word X, ``16 + 4 c ..`` from word X + 1; any k order
works when B uses the same). B in lane ``4 g + c`` is activation row ``g`` of the group, the same
eight values: one 16-byte load of x's packed layout (per 8 values the two words of digit h, then
the two of digit l). The accumulator's element ``(r, p)`` of lane ``4 g + c`` is weight row
``g + 8 r``, activation row ``2 c + p``.

Gluon, CUDA only (compute capability 8.0+).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch.mma import prefetch_l2, rows_layout, rows_prefetch_rows, rows_program, rows_store
from ..launch.pdl import enter
from ..launch.rows import rows_gemm
from .plane import Q4KPlane


def _scaled_mma(high: bool, digit: int) -> str:
    """PTX: ``$0..3 = $16..19 + $12..15 * mma(A, B)`` per element; A the low (or ``high``) nibbles
    of words $4..7, B x's digit ``digit`` ($8, $9: h; $10, $11: l)."""
    words = ("$4", "$6", "$5", "$7")  # (row g, X), (row g + 8, X), (row g, X + 1), (row g + 8, X + 1)
    a = "".join(f"shr.b32 a{i}, {w}, 4; and.b32 a{i}, a{i}, 0x0F0F0F0F; " if high else
                f"and.b32 a{i}, {w}, 0x0F0F0F0F; " for i, w in enumerate(words))
    b = "{$8, $9}" if digit == 0 else "{$10, $11}"
    return ("{\n.reg .b32 a<4>, s<4>, z;\nmov.b32 z, 0;\n" + a + "\n"
            f"mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {{s0, s1, s2, s3}}, {{a0, a1, a2, a3}}, {b}, "
            "{z, z, z, z};\n"
            + " ".join(f"mad.lo.s32 ${i}, s{i}, ${12 + i}, ${16 + i};" for i in range(4)) + "\n}")


_LOW_H, _LOW_L = gl.constexpr(_scaled_mma(False, 0)), gl.constexpr(_scaled_mma(False, 1))
_HIGH_H, _HIGH_L = gl.constexpr(_scaled_mma(True, 0)), gl.constexpr(_scaled_mma(True, 1))
_ARGS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 16))


@gluon.jit
def _sub_block(q, xw, scw, xsum, shift: gl.constexpr, sums, HIGH: gl.constexpr):
    """Sub-block sums added to ``sums`` = (H, L, Hm): A words ``q`` (elements (r, p): word X + p of
    row g + 8 r), B words ``xw`` (h, h, l, l), scale words ``scw`` (scale and min bytes at
    ``shift``), x's integer sum ``xsum``."""
    h, low, hm = sums
    sc = (scw >> shift) & 0xFF
    if HIGH:
        h = gl.inline_asm_elementwise(_HIGH_H, _ARGS, [q, xw, sc, h], dtype=gl.int32, is_pure=True, pack=4)
        low = gl.inline_asm_elementwise(_HIGH_L, _ARGS, [q, xw, sc, low], dtype=gl.int32, is_pure=True, pack=4)
    else:
        h = gl.inline_asm_elementwise(_LOW_H, _ARGS, [q, xw, sc, h], dtype=gl.int32, is_pure=True, pack=4)
        low = gl.inline_asm_elementwise(_LOW_L, _ARGS, [q, xw, sc, low], dtype=gl.int32, is_pure=True, pack=4)
    hm += ((scw >> (shift + 8)) & 0xFF) * xsum
    return h, low, hm


@gluon.jit
def _load_span(t, qw_ptr, q_off, sc_ptr, sc_off):
    """Span ``t``'s weight words: (words X + p of sub-blocks 0 and 2, of 1 and 3, scale words of
    sub-blocks 0 and 1, of 2 and 3)."""
    return (gl.load(qw_ptr + q_off + t * 16), gl.load(qw_ptr + q_off + t * 16 + 8),
            gl.load(sc_ptr + sc_off + t * 2), gl.load(sc_ptr + sc_off + t * 2 + 1))


@gluon.jit
def _span(t, w, sums, xq_ptr, x_off, xsum_ptr, cols, MP):
    """Span ``t``'s four sub-blocks (weight words ``w``) added to the block's integer sums."""
    q0, q1, sc01, sc23 = w
    xb = xq_ptr + x_off + t * 64
    xsb = xsum_ptr + cols + (t * 4) * MP
    sums = _sub_block(q0, gl.load(xb), sc01, gl.load(xsb), 0, sums, False)
    sums = _sub_block(q1, gl.load(xb + 16), sc01, gl.load(xsb + MP), 16, sums, False)
    sums = _sub_block(q0, gl.load(xb + 32), sc23, gl.load(xsb + 2 * MP), 0, sums, True)
    sums = _sub_block(q1, gl.load(xb + 48), sc23, gl.load(xsb + 3 * MP), 16, sums, True)
    return sums


@gluon.jit
def _block(b, wa, wb, dmw, acc, zero, xq_ptr, x_off, xs_ptr, xsum_ptr, cols, MP):
    """Block ``b`` (weight words ``wa``, ``wb`` of its spans, scale word ``dmw``) added to ``acc``."""
    sums = _span(2 * b, wa, (zero, zero, zero), xq_ptr, x_off, xsum_ptr, cols, MP)
    h, low, hm = _span(2 * b + 1, wb, sums, xq_ptr, x_off, xsum_ptr, cols, MP)
    d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = ((dmw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    xs = gl.load(xs_ptr + b * MP + cols)
    return acc + xs * (d * (h.to(gl.float32) * 256.0 + low.to(gl.float32)) - dmin * hm.to(gl.float32))


@gluon.jit
def _prefetch_block(qw_ptr, sc_ptr, prow, NT, b):
    """Ask L2 for block ``b``'s weight words and scales (one 128-byte line each) of the rows at ``prow``."""
    prefetch_l2(qw_ptr + prow * (NT * 16) + b * 32)
    prefetch_l2(sc_ptr + prow * (NT * 2) + b * 4)


@gluon.jit
def _gemm_q4p_mma_kernel(xq_ptr, xs_ptr, xsum_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, res_ptr, y_ptr, M, MP, N, NT,
                         HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, T: gl.constexpr, G: gl.constexpr,
                         SPLIT: gl.constexpr, AHEAD: gl.constexpr, PDL: gl.constexpr):
    """Grid (cdiv(M, 8 G), cdiv(N, 16 T num_warps), SPLIT): a program owns G groups of 8 activation
    rows, a warp T tiles of 16 weight rows, a split ``cdiv(NT / 2, SPLIT)`` blocks. ``y`` (M, N), or
    with SPLIT > 1 the partials (SPLIT, M, N) (bias and residual are then added by the reduction).
    x's tables have a row stride ``MP`` >= 8 G cdiv(M, 8 G). AHEAD > 0: each block first asks L2
    for the weight words and scales of the block AHEAD blocks on (one 128-byte line a row each), so
    that the loads of later blocks wait on L2 rather than on memory. PDL: the first block's lines are
    asked for before the wait for the previous kernel (``launch.pdl``)."""
    L: gl.constexpr = rows_layout(gl.num_warps(), T, G)
    rows, row, xrow, cols, ac, ar, ap = rows_program(L, T, G, M, N)
    q_off = row * (NT * 16) + ac * 2 + ap  # word X + p of the sub-block's run
    sc_off = row * (NT * 2)  # word 2 t + s // 2 holds sub-block 4 t + s's (scale, min) at 16 (s % 2)
    dm_off = row * (NT // 2)  # word b: d (low 16 bits), dmin (high)
    # B: activation row g of the group, 8-value run c of a sub-block: words (16 t + 4 s + c) * 4 + 2 r + p
    x_off = xrow * (NT * 64) + ac * 4 + ar * 2 + ap
    # x's per-block scale (NT / 2, MP) and per-sub-block integer sums (2 NT, MP) at activation row cols

    nb = NT // 2
    per = gl.cdiv(nb, SPLIT)
    first = gl.program_id(2) * per
    last = gl.minimum(first + per, nb)
    acc = gl.zeros([gl.num_warps(), T, G, 8, 4, 2, 2], gl.float32, layout=L)
    zero = gl.zeros([gl.num_warps(), T, G, 8, 4, 2, 2], gl.int32, layout=L)
    prow = rows_prefetch_rows(L, T, N)  # one address a weight row for the prefetches
    if PDL:  # weights: nothing an earlier kernel writes
        _prefetch_block(qw_ptr, sc_ptr, prow, NT, gl.minimum(first, nb - 1))
    enter(PDL)
    for b in range(first, last):
        if AHEAD > 0:
            _prefetch_block(qw_ptr, sc_ptr, prow, NT, gl.minimum(b + AHEAD, last - 1))
        wa = _load_span(2 * b, qw_ptr, q_off, sc_ptr, sc_off)
        wb = _load_span(2 * b + 1, qw_ptr, q_off, sc_ptr, sc_off)
        acc = _block(b, wa, wb, gl.load(dm_ptr + dm_off + b), acc, zero, xq_ptr, x_off, xs_ptr, xsum_ptr, cols, MP)
    rows_store(acc, rows, cols, M, N, bias_ptr, res_ptr, y_ptr, HAS_BIAS, HAS_RES, SPLIT)


def gemm_q4p_mma(x: torch.Tensor, plane: Q4KPlane, bias, tiles: int, groups: int, num_warps: int, split: int,
                 residual=None, norm=None, swiglu: bool = False, ahead: int | None = None,
                 pdl: bool = False) -> torch.Tensor:
    """``launch.rows.rows_gemm`` over a q4_K plane."""
    n, half_k = plane.qs.shape
    return rows_gemm(_gemm_q4p_mma_kernel, plane.words(), n, half_k // 64, x, bias, tiles, groups, num_warps,
                     split, residual, norm, swiglu, ahead, pdl)
