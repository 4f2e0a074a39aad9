"""The q6_K int8 GEMM of the batched step on tensor cores: activation rows as the MMA's N, as in
``q4_k.gemm_mma`` (read that first).

q6_K scales every 16 values, so each MMA is an ``m16n8k16`` (s8 x s8 -> s32) over one 16-value
group: 16 weight rows as A, 8 activation rows as B. A holds the signed values ``q = u - 32``
themselves (``u = ql | qh << 4``), so no offset term is needed: per byte ``q = nibble | ((hb + 14)
mod 16) << 4`` (``hb`` the two high bits: 0, 1, 2, 3 give high nibbles E, F, 0, 1, i.e. -32, -16,
0, 16). Each group's two MMAs (x's digits h and l) are multiplied by the group's int8 scale into two
block sums H and L; once per block these meet the floats: ``xs d (256 H + L)``. Every sum is exact
in int32 (``|H| <= 16 * 128 * 16 * 32 * 128 < 2^31``), so a row's bits never depend on the other
rows or on how many there are; the split-K partials meet in a fixed order and the split comes from
the weight's shape.

Mapping (decode plane, ``q6_k.plane.Q6KDecodePlane``; value ``128h + 32k + 16s + 4w + j`` of a
block is nibble ``k // 2`` of ``ql`` word ``16h + 8(k % 2) + 4s + w`` with bits ``2k, 2k + 1`` of
``qh`` word ``32 + 8h + 4s + w``; group ``(h, k, s)`` has scale byte ``8h + 2k + s``). Per block a
lane ``4g + c`` walks the four ``(h, s)``; for each it loads, of weight rows ``g + 8r``, ``ql`` words
``16h + 8p + 4s + c`` (element ``(r, p)``) and the ``qh`` word ``32 + 8h + 4s + c``, which give the
A registers of groups ``k = p`` (low nibbles) and ``k = p + 2`` (high): values ``4c .. 4c + 3`` of
the group at k slots ``4c ..``. B: those values of activation row ``g``, x's digit word (rows
layout of ``ops.quant_x``: per 8 values the two words of digit h, then the two of digit l), element
``(r, p)`` for group ``k = 2r + p``. The accumulator's element ``(r, p)`` of lane ``4g + c`` is weight
row ``g + 8r``, activation row ``2c + p``.

Gluon, CUDA only (compute capability 8.0+).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch.mma import prefetch_l2, rows_layout, rows_prefetch_rows, rows_program, rows_store
from ..launch.pdl import enter
from ..launch.rows import rows_gemm
from .plane import DECODE_BYTES, QH_AT, SC_AT, Q6KDecodePlane

WW = gl.constexpr(DECODE_BYTES // 4)  # 32-bit words of a block in the decode plane (ql | qh | scales)
QH_W = gl.constexpr(QH_AT // 4)  # word of qh in a block
SC_W = gl.constexpr(SC_AT // 4)  # word of the int8 scales in a block


def _scaled_mma4() -> str:
    """PTX: ``$0..3 = $4..7 + sum_k sc_k(r) * mma(A_k, X_k)`` over the four groups ``k`` of an
    ``(h, s)``; A_k of rows g / g + 8: ``$8..11`` (k = p: elements (r, p)) and ``$12..15`` (k = p + 2),
    their scales ``$16..19`` / ``$20..23``, B ``$24..27`` (group k = 2r + p)."""
    lines = ["{", ".reg .b32 s<4>, z;", "mov.b32 z, 0;"]
    for k in range(4):
        a, sc = (8, 16) if k < 2 else (12, 20)
        p = k % 2
        lines.append(f"mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {{s0, s1, s2, s3}}, "
                     f"{{${a + p}, ${a + 2 + p}}}, {{${24 + k}}}, {{z, z, z, z}};")
        for i in range(4):  # output (r, q) = element i: row g + 8r's scale for group k
            acc = f"${4 + i}" if k == 0 else f"${i}"
            lines.append(f"mad.lo.s32 ${i}, s{i}, ${sc + 2 * (i // 2) + p}, {acc};")
    lines.append("}")
    return "\n".join(lines)


_MMA4 = gl.constexpr(_scaled_mma4())
_ARGS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 24))


@gluon.jit
def _groups(q_lo, q_hi, sc_lo, sc_hi, xw, acc):
    """``acc`` + the four groups' scaled integer sums for one digit of x (words ``xw``)."""
    return gl.inline_asm_elementwise(_MMA4, _ARGS, [acc, q_lo, q_hi, sc_lo, sc_hi, xw], dtype=gl.int32,
                                     is_pure=True, pack=4)


@gluon.jit
def _signed(nib, qh, shift):
    """Bytes ``nib | hb << 4 - 32`` as int8 (``hb`` = qh's bits at ``shift``, per byte)."""
    hb = (qh >> shift) & 0x03030303
    return nib | (((hb + 0x0E0E0E0E) & 0x0F0F0F0F) << 4)


@gluon.jit
def _block(b, w32_ptr, q_off, qh_off, sc_off, ap, d, acc, zero, xq_ptr, x_off, xs_ptr, cols, MP):
    """Block ``b`` added to ``acc``: its 16 groups' integer sums, then the block's floats."""
    hsum = zero
    lsum = zero
    base = b * WW
    for h in gl.static_range(2):
        sc_a = gl.load(w32_ptr + sc_off + base + SC_W + 2 * h)  # scale bytes 8h .. 8h + 3 (k < 2)
        sc_b = gl.load(w32_ptr + sc_off + base + SC_W + 2 * h + 1)  # 8h + 4 .. 8h + 7 (k >= 2)
        for s in gl.static_range(2):
            ql = gl.load(w32_ptr + q_off + base + 16 * h + 4 * s)  # (r, p): ql word 16h + 8p + 4s + c
            qh = gl.load(w32_ptr + qh_off + base + QH_W + 8 * h + 4 * s)
            q_lo = _signed(ql & 0x0F0F0F0F, qh, 2 * ap)  # k = p
            q_hi = _signed((ql >> 4) & 0x0F0F0F0F, qh, 2 * ap + 4)  # k = p + 2
            sh = 24 - 8 * (2 * ap + s)  # byte 2p + s of a scale word, sign-extended
            sc_lo = (sc_a << sh) >> 24
            sc_hi = (sc_b << sh) >> 24
            xb = xq_ptr + x_off + b * 128 + 64 * h + 8 * s  # + 16 k (k = 2r + p), digit l at + 2
            hsum = _groups(q_lo, q_hi, sc_lo, sc_hi, gl.load(xb), hsum)
            lsum = _groups(q_lo, q_hi, sc_lo, sc_hi, gl.load(xb + 2), lsum)
    xs = gl.load(xs_ptr + b * MP + cols)
    return acc + xs * (d * (hsum.to(gl.float32) * 256.0 + lsum.to(gl.float32)))


@gluon.jit
def _prefetch_block(row_ptr, b):
    """Ask L2 for block ``b``'s two 128-byte lines of the rows starting at ``row_ptr``."""
    prefetch_l2(row_ptr + b * WW)
    prefetch_l2(row_ptr + b * WW + 32)


@gluon.jit
def _gemm_q6_mma_kernel(xq_ptr, xs_ptr, xsum_ptr, w32_ptr, d_ptr, bias_ptr, res_ptr, y_ptr, M, MP, N, NB,
                        HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, T: gl.constexpr, G: gl.constexpr,
                        SPLIT: gl.constexpr, AHEAD: gl.constexpr, PDL: gl.constexpr):
    """Grid (cdiv(M, 8 G), cdiv(N, 16 T num_warps), SPLIT): a program owns G groups of 8 activation
    rows, a warp T tiles of 16 weight rows, a split ``cdiv(NB, SPLIT)`` blocks. ``y`` (M, N), or with
    SPLIT > 1 the partials (SPLIT, M, N); x's sub-block sums ``xsum`` are not read (no offset term).
    AHEAD > 0: each block first asks L2 for the block AHEAD
    blocks on (two 128-byte lines a row); PDL: the first block's, before the wait for the previous
    kernel (``launch.pdl``)."""
    L: gl.constexpr = rows_layout(gl.num_warps(), T, G)
    rows, row, xrow, cols, ac, ar, ap = rows_program(L, T, G, M, N)
    sc_off = row * (NB * WW)  # a weight row's first word
    q_off = sc_off + 8 * ap + ac  # ql word 16h + 8p + 4s + c, less 16h + 4s
    qh_off = sc_off + ac + (ap * 0)
    dm_off = row * NB
    # B: activation row g of the group; values 4c .. of group k = 2r + p: digit-h word
    # 64h + 16k + 8s + 4 (c // 2) + c % 2 of the block
    x_off = xrow * (NB * 128) + 16 * (2 * ar + ap) + 4 * (ac // 2) + ac % 2

    per = gl.cdiv(NB, SPLIT)
    first = gl.program_id(2) * per
    last = gl.minimum(first + per, NB)
    acc = gl.zeros([gl.num_warps(), T, G, 8, 4, 2, 2], gl.float32, layout=L)
    zero = gl.zeros([gl.num_warps(), T, G, 8, 4, 2, 2], gl.int32, layout=L)
    prow = rows_prefetch_rows(L, T, N) * (NB * WW)
    if PDL:  # weights: nothing an earlier kernel writes
        _prefetch_block(w32_ptr + prow, gl.minimum(first, NB - 1))
    enter(PDL)
    for b in range(first, last):
        if AHEAD > 0:
            _prefetch_block(w32_ptr + prow, gl.minimum(b + AHEAD, last - 1))
        acc = _block(b, w32_ptr, q_off, qh_off, sc_off, ap, gl.load(d_ptr + dm_off + b).to(gl.float32), acc, zero,
                     xq_ptr, x_off, xs_ptr, cols, MP)
    rows_store(acc, rows, cols, M, N, bias_ptr, res_ptr, y_ptr, HAS_BIAS, HAS_RES, SPLIT)


def gemm_q6_mma(x: torch.Tensor, plane: Q6KDecodePlane, bias, tiles: int, groups: int, num_warps: int,
                split: int, residual=None, norm=None, swiglu: bool = False, ahead: int | None = None,
                pdl: bool = False) -> torch.Tensor:
    """``launch.rows.rows_gemm`` over a q6_K decode plane."""
    n, nb = plane.d.shape
    return rows_gemm(_gemm_q6_mma_kernel, (plane.w.view(torch.int32), plane.d), n, nb, x, bias, tiles, groups,
                     num_warps, split, residual, norm, swiglu, ahead, pdl)
