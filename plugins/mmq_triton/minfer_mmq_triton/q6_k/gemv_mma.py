"""The q6_K int8 decode GEMV on tensor cores: ``mma.sync`` (m16n8k32, u8 x s8 -> s32) with 16 weight
rows as A and the activation's two int8 digits as B, mapped as in ``q4_k.gemv_mma`` (read that first).

Decode plane: ``q6_k.plane.Q6KDecodePlane``, ``WB`` bytes a block: ``ql`` words 0..31, ``qh``
words ``QH_W ..`` (32..47), int8 scales at bytes ``SC ..`` (192..207)). Value ``128h + 32k + 16s + 4w + (0..3)`` (``h, s < 2``,
``k, w < 4``) is the 6-bit ``u = ql | qh << 4`` of nibble ``k // 2`` of ``ql`` word
``16h + 8(k % 2) + 4s + w`` and bits ``2k, 2k + 1`` of ``qh`` word ``32 + 8h + 4s + w``; the 16 values of
``(h, k, s)`` share scale byte ``8h + 2k + s``; ``q = u - 32``. A group ``(h, s)`` is four sub-blocks
``k = 0..3``, two MMAs ``m``: lane ``4g + c`` puts ``u`` of word ``w = 2(c % 2) + m`` for ``k = c // 2``
(from the low nibbles) at k rows ``4c ..`` and for ``k = 2 + c // 2`` (high nibbles, same ``ql`` word)
at ``16 + 4c ..``, so the B columns and the accumulator read as for q4_K with ``s`` = k. The offset:
``sum q x = sum u x - 32 sum x`` per 16 values.

Same arithmetic as the dp4a kernels (exact integer sub-block sums, scaled in float32); the float
summation order differs; the PDL entry (``launch.pdl.enter``) and the split-K store (``launch.split.store_rows``)
are the Triton kernels' own, the latter through ``launch.cluster.store_split_rows`` (the splits of a row block
reduced inside a cluster, on compute capability 9.0+). Gluon, CUDA only (compute capability 8.0+).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch.cluster import launch_split, split_ids, store_split_rows
from ..launch.mma import ax
from ..launch.pdl import enter, launch_args, release
from ..launch.split import SplitScratch, bias_or_residual, whole_steps
from ..ops.quant_x import quantize_x
from .plane import DECODE_BYTES, QH_AT, SC_AT

WB = gl.constexpr(DECODE_BYTES)  # bytes of a block in the decode plane
WW = gl.constexpr(DECODE_BYTES // 4)  # its 32-bit words
QH_W = gl.constexpr(QH_AT // 4)  # word of qh in a block
SC = gl.constexpr(SC_AT)  # byte offset of the int8 scales

_Q6_MMA2 = gl.constexpr("""{
.reg .b32 a0, a1, a2, a3, t, z;
mov.b32 z, 0;
shr.b32 t, $8, $16; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; and.b32 a0, $4, 0x0F0F0F0F; or.b32 a0, a0, t;
shr.b32 t, $10, $16; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; and.b32 a1, $6, 0x0F0F0F0F; or.b32 a1, a1, t;
shr.b32 t, $8, $18; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; shr.b32 a2, $4, 4; and.b32 a2, a2, 0x0F0F0F0F; or.b32 a2, a2, t;
shr.b32 t, $10, $18; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; shr.b32 a3, $6, 4; and.b32 a3, a3, 0x0F0F0F0F; or.b32 a3, a3, t;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$12, $14}, {z, z, z, z};
shr.b32 t, $9, $16; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; and.b32 a0, $5, 0x0F0F0F0F; or.b32 a0, a0, t;
shr.b32 t, $11, $16; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; and.b32 a1, $7, 0x0F0F0F0F; or.b32 a1, a1, t;
shr.b32 t, $9, $18; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; shr.b32 a2, $5, 4; and.b32 a2, a2, 0x0F0F0F0F; or.b32 a2, a2, t;
shr.b32 t, $11, $18; and.b32 t, t, 0x03030303; shl.b32 t, t, 4; shr.b32 a3, $7, 4; and.b32 a3, a3, 0x0F0F0F0F; or.b32 a3, a3, t;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$13, $15}, {$0, $1, $2, $3};
}""")
_Q6_MMA2_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 16))


@gluon.jit
def _group_sums(ql_g, ql_h, qh_g, qh_h, b0, b1, sh0, sh1):
    """Two MMAs over one q6_K group: ``[..., 2]`` (word pair m) of ``ql`` / ``qh`` words of rows g and
    g + 8, B registers, qh shifts (``2 (c // 2)``, ``4 + 2 (c // 2)``) -> (row g: h, l), (row g + 8: h, l)."""
    return gl.inline_asm_elementwise(_Q6_MMA2, _Q6_MMA2_CONSTRAINTS, [ql_g, ql_h, qh_g, qh_h, b0, b1, sh0, sh1],
                                     dtype=(gl.int32, gl.int32), is_pure=True, pack=2)


@gluon.jit
def _weight_loads(b0_, hi, w32_ptr, w8_ptr, d_ptr, r_g, r_h, ql_col, qh_col, sr_g, sr_h, sc_col, ab, sb, NB,
                  EVICT: gl.constexpr, EVEN: gl.constexpr):
    """The weight words step ``b0_`` (blocks ``b0_ .. b0_ + S - 1``, none at or past ``hi`` unless EVEN) reads:
    ``ql`` / ``qh`` words of rows g and g + 8, scale bytes, ``d``. No kernel writes them: they may load
    before the PDL wait."""
    if EVEN:
        ql_g = gl.load(w32_ptr + r_g + b0_ * WW + ql_col, eviction_policy=EVICT)
        ql_h = gl.load(w32_ptr + r_h + b0_ * WW + ql_col, eviction_policy=EVICT)
        qh_g = gl.load(w32_ptr + r_g + b0_ * WW + qh_col, eviction_policy=EVICT)
        qh_h = gl.load(w32_ptr + r_h + b0_ * WW + qh_col, eviction_policy=EVICT)
        scg = gl.load(w8_ptr + sr_g * (NB * WB) + b0_ * WB + sc_col).to(gl.float32)
        sch = gl.load(w8_ptr + sr_h * (NB * WB) + b0_ * WB + sc_col).to(gl.float32)
        dg = gl.load(d_ptr + sr_g * NB + b0_ + sb).to(gl.float32)
        dh = gl.load(d_ptr + sr_h * NB + b0_ + sb).to(gl.float32)
    else:
        bm7 = (b0_ + ab) < hi
        bm6 = (b0_ + sb) < hi
        ql_g = gl.load(w32_ptr + r_g + b0_ * WW + ql_col, mask=bm7, other=0, eviction_policy=EVICT)
        ql_h = gl.load(w32_ptr + r_h + b0_ * WW + ql_col, mask=bm7, other=0, eviction_policy=EVICT)
        qh_g = gl.load(w32_ptr + r_g + b0_ * WW + qh_col, mask=bm7, other=0, eviction_policy=EVICT)
        qh_h = gl.load(w32_ptr + r_h + b0_ * WW + qh_col, mask=bm7, other=0, eviction_policy=EVICT)
        scg = gl.load(w8_ptr + sr_g * (NB * WB) + b0_ * WB + sc_col, mask=bm6, other=0).to(gl.float32)
        sch = gl.load(w8_ptr + sr_h * (NB * WB) + b0_ * WB + sc_col, mask=bm6, other=0).to(gl.float32)
        dg = gl.load(d_ptr + sr_g * NB + b0_ + sb, mask=bm6, other=0.0).to(gl.float32)
        dh = gl.load(d_ptr + sr_h * NB + b0_ + sb, mask=bm6, other=0.0).to(gl.float32)
    return ql_g, ql_h, qh_g, qh_h, scg, sch, dg, dh


@gluon.jit
def _x_loads(b0_, hi, xs_ptr, x16_ptr, x_src, x_word, x_valid, ab, sb, xblk, x16i, EVEN: gl.constexpr):
    """What step ``b0_`` reads of x: the lane's x run, the block scales and sums."""
    if EVEN:
        xv = gl.load(x_src + b0_ * 64 + x_word, mask=x_valid, other=0)
        xs = gl.load(xs_ptr + xblk + b0_ * 8)
        x16 = gl.load(x16_ptr + x16i + b0_ * 16)
    else:
        bm7 = (b0_ + ab) < hi
        bm6 = (b0_ + sb) < hi
        xv = gl.load(x_src + b0_ * 64 + x_word, mask=x_valid & bm7, other=0)
        xs = gl.load(xs_ptr + xblk + b0_ * 8, mask=bm6, other=0.0)
        x16 = gl.load(x16_ptr + x16i + b0_ * 16, mask=bm6, other=0.0)
    return xv, xs, x16


@gluon.jit
def _step_loads(b0_, hi, w32_ptr, w8_ptr, d_ptr, xs_ptr, x16_ptr, x_src, r_g, r_h, ql_col, qh_col, x_word, x_valid,
                sr_g, sr_h, sc_col, ab, sb, xblk, x16i, NB, EVICT: gl.constexpr, EVEN: gl.constexpr):
    """Everything step ``b0_`` reads (:func:`_weight_loads`, :func:`_x_loads`)."""
    ql_g, ql_h, qh_g, qh_h, scg, sch, dg, dh = _weight_loads(b0_, hi, w32_ptr, w8_ptr, d_ptr, r_g, r_h, ql_col, qh_col,
                                                             sr_g, sr_h, sc_col, ab, sb, NB, EVICT, EVEN)
    xv, xs, x16 = _x_loads(b0_, hi, xs_ptr, x16_ptr, x_src, x_word, x_valid, ab, sb, xblk, x16i, EVEN)
    return ql_g, ql_h, qh_g, qh_h, xv, scg, sch, dg, dh, xs, x16


@gluon.jit
def _step_acc(acc_g, acc_h, cur, low_col, sh0, sh1, L6: gl.constexpr):
    """``acc_g`` / ``acc_h`` (rows g / g + 8) plus one step's scaled group sums (``cur``: :func:`_step_loads`)."""
    ql_g, ql_h, qh_g, qh_h, xv, scg, sch, dg, dh, xs, x16 = cur
    b0 = gl.where(low_col, xv, 0)
    b1 = gl.where(low_col, 0, xv)
    sg_, sh_ = _group_sums(ql_g, ql_h, qh_g, qh_h, b0, b1, sh0, sh1)  # [.., 2]: (h, l) digit sums
    hg, lg = gl.split(sg_)
    hh_, lh_ = gl.split(sh_)
    vg = gl.convert_layout(hg, L6).to(gl.float32) + gl.convert_layout(lg, L6).to(gl.float32) * (1.0 / 256.0)
    vh = gl.convert_layout(hh_, L6).to(gl.float32) + gl.convert_layout(lh_, L6).to(gl.float32) * (1.0 / 256.0)
    return acc_g + (dg * scg) * (vg * xs - 32.0 * x16), acc_h + (dh * sch) * (vh * xs - 32.0 * x16)


@gluon.jit
def _gemv_q6k_mma_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, w8_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    PDL: gl.constexpr, EVICT: gl.constexpr = "", CLUSTER: gl.constexpr = False, LOOKAHEAD: gl.constexpr = False,
    EARLY: gl.constexpr = False,
):
    """Grid (cdiv(N, 16 T num_warps), SPLIT, M), or with CLUSTER ``(cdiv(N, BN), 1, M)`` in clusters of
    SPLIT (``launch.cluster``): one program of :func:`gemv_q6k_mma_program`."""
    pid, s_id = split_ids(SPLIT, CLUSTER)
    gemv_q6k_mma_program(pid, s_id, gl.program_id(2), xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, w8_ptr, d_ptr,
                         bias_ptr, y_ptr, part_ptr, cnt_ptr, N, NB, stride_ym, stride_bm, n_blocks, HAS_BIAS, EVEN,
                         T, S, SPLIT, PDL, EVICT, CLUSTER, LOOKAHEAD, EARLY)


@gluon.jit
def gemv_q6k_mma_program(
    pid, s_id, xm, xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, w8_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    PDL: gl.constexpr, EVICT: gl.constexpr, CLUSTER: gl.constexpr, LOOKAHEAD: gl.constexpr, EARLY: gl.constexpr,
):
    """Program ``(pid, s_id)`` (row block, split) for activation row ``xm``: a warp owns T tiles of 16
    rows; a step is S blocks. EVICT: the L1 eviction policy of the quant words
    (``tiles.q6k_evict_first``). CLUSTER, LOOKAHEAD and EARLY: as in ``q4_k.gemv_mma``."""
    W: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = 16 * T * W
    # axes [warp, tile, block, g, c, group (h, s), m]
    L7: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 4, 2], [1, 1, 1, 8, 4, 1, 1], [W, 1, 1, 1, 1, 1, 1],
                                        [6, 5, 4, 3, 2, 1, 0])
    L6: gl.constexpr = gl.SliceLayout(6, L7)  # [W, T, S, 8, 4, 4]
    LY: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, L6)))  # [W, T, 8]

    aw, at, ab = ax(W, 0, 7, L7), ax(T, 1, 7, L7), ax(S, 2, 7, L7)
    ag, ac, agr, am = ax(8, 3, 7, L7), ax(4, 4, 7, L7), ax(4, 5, 7, L7), ax(2, 6, 7, L7)
    row_g = pid * BN + (aw * T + at) * 16 + ag
    r_g = gl.minimum(row_g, N - 1).to(gl.int64) * (NB * WW)
    r_h = gl.minimum(row_g + 8, N - 1).to(gl.int64) * (NB * WW)
    hh = agr // 2
    ss = agr % 2
    w4 = 2 * (ac % 2) + am
    ql_col = ab * WW + 16 * hh + 8 * (ac // 2) + 4 * ss + w4  # [1, 1, S, 1, 4, 4, 2] words of step block b
    qh_col = ab * WW + QH_W + 8 * hh + 4 * ss + w4
    sh0 = 2 * (ac // 2) + am * 0
    sh1 = sh0 + 4
    # B: lane (g, c): digit g % 2 of the words k = c // 2 (low) / 2 + c // 2 (high) when in column g's
    # sub-block g // 2
    gs = ag // 2
    x_valid = (gs % 2) == (ac // 2)
    x_word = ab * 64 + 32 * hh + 8 * ((gs // 2) * 2 + ac // 2) + 4 * ss + w4  # x word (4 values) in the step
    low_col = gs < 2
    x_src = gl.where((ag % 2) == 0, xh_ptr, xl_ptr) + xm * (NB * 64)
    # per (row, group, lane's k = c): scale byte 8h + 2c + s, d; x block 8b + 4h + c, x16 2 (..) + s
    sw, st, sb = ax(W, 0, 6, L6), ax(T, 1, 6, L6), ax(S, 2, 6, L6)
    sg, sc_, sgr = ax(8, 3, 6, L6), ax(4, 4, 6, L6), ax(4, 5, 6, L6)
    srow = pid * BN + (sw * T + st) * 16 + sg
    sr_g = gl.minimum(srow, N - 1).to(gl.int64)
    sr_h = gl.minimum(srow + 8, N - 1).to(gl.int64)
    sc_col = sb * WB + SC + 8 * (sgr // 2) + 2 * sc_ + sgr % 2
    xblk = xm * (NB * 8) + sb * 8 + 4 * (sgr // 2) + sc_
    x16i = 2 * xblk + sgr % 2

    per = gl.cdiv(gl.cdiv(NB, SPLIT), S) * S
    lo = s_id * per
    hi = gl.minimum(lo + per, NB)
    if EARLY:  # the first step's weight words load before the wait (no kernel writes them)
        w0 = _weight_loads(lo, hi, w32_ptr, w8_ptr, d_ptr, r_g, r_h, ql_col, qh_col, sr_g, sr_h, sc_col, ab, sb, NB,
                           EVICT, EVEN)
    enter(PDL, False)  # the next kernel launches when the loop is done (launch.pdl)
    acc_g = gl.zeros([W, T, S, 8, 4, 4], gl.float32, layout=L6)
    acc_h = gl.zeros([W, T, S, 8, 4, 4], gl.float32, layout=L6)
    if EARLY:
        ql_g, ql_h, qh_g, qh_h, scg, sch, dg, dh = w0
        xv, xs, x16 = _x_loads(lo, hi, xs_ptr, x16_ptr, x_src, x_word, x_valid, ab, sb, xblk, x16i, EVEN)
        first = (ql_g, ql_h, qh_g, qh_h, xv, scg, sch, dg, dh, xs, x16)
    if LOOKAHEAD:
        if EARLY:
            cur = first
        else:
            cur = _step_loads(lo, hi, w32_ptr, w8_ptr, d_ptr, xs_ptr, x16_ptr, x_src, r_g, r_h, ql_col, qh_col, x_word,
                              x_valid, sr_g, sr_h, sc_col, ab, sb, xblk, x16i, NB, EVICT, EVEN)
        for b0_ in range(lo, hi, S):  # the next step's loads go out before this step's arithmetic
            b_next = b0_ + S
            if EVEN:
                b_next = gl.minimum(b_next, hi - S)  # the last step re-reads itself (in bounds)
            nxt = _step_loads(b_next, hi, w32_ptr, w8_ptr, d_ptr, xs_ptr, x16_ptr, x_src, r_g, r_h, ql_col, qh_col,
                              x_word, x_valid, sr_g, sr_h, sc_col, ab, sb, xblk, x16i, NB, EVICT, EVEN)
            acc_g, acc_h = _step_acc(acc_g, acc_h, cur, low_col, sh0, sh1, L6)
            cur = nxt
    else:
        start = lo
        if EARLY:  # the first step apart, from the words loaded before the wait
            acc_g, acc_h = _step_acc(acc_g, acc_h, first, low_col, sh0, sh1, L6)
            start = lo + S
        for b0_ in range(start, hi, S):
            cur = _step_loads(b0_, hi, w32_ptr, w8_ptr, d_ptr, xs_ptr, x16_ptr, x_src, r_g, r_h, ql_col, qh_col, x_word,
                              x_valid, sr_g, sr_h, sc_col, ab, sb, xblk, x16i, NB, EVICT, EVEN)
            acc_g, acc_h = _step_acc(acc_g, acc_h, cur, low_col, sh0, sh1, L6)
    release(PDL)
    y = gl.join(gl.sum(gl.sum(gl.sum(acc_g, axis=5), axis=4), axis=2),
                gl.sum(gl.sum(gl.sum(acc_h, axis=5), axis=4), axis=2))  # [W, T, 8, 2]: rows g, g + 8
    LJ: gl.constexpr = gl.BlockedLayout([1, T, 1, 2], [1, 1, 8, 4], [W, 1, 1, 1], [3, 2, 1, 0])
    y = gl.convert_layout(y, LJ)
    rows = pid * BN + (ax(W, 0, 4, LJ) * T + ax(T, 1, 4, LJ)) * 16 + ax(8, 2, 4, LJ) + 8 * ax(2, 3, 4, LJ)
    store_split_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
                     HAS_BIAS, SPLIT, CLUSTER, BN)


def gemv_q6k_mma(x: torch.Tensor, data, bias, tiles: int, blocks: int, num_warps: int, split: int,
                 scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
                 pdl: bool = False, xq: tuple | None = None, evict_first: bool = False,
                 cluster: bool = False, lookahead: bool = False, early: bool = False) -> torch.Tensor:
    """A q6_K decode plane (``q6_k.plane.Q6KDecodePlane``); the contract of ``q6_k.gemv_i8.gemv_i8``;
    ``scratch`` built for ``BN = mma_rows(tiles, num_warps)``; ``blocks`` 256-value blocks a step;
    ``xq``: x already in ``quant_x.FORM`` (no norm or SwiGLU then); ``evict_first``: the quant words
    leave L1 first (``tiles.q6k_evict_first``); ``cluster`` and ``lookahead``: as in
    ``q4_k.gemv_mma.gemv_q4p_mma``; ``early``: the first step's weight words before the PDL wait."""
    n, nb = data.d.shape
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl) if xq is None else xq
    args = (xh, xl, xs, x16, data.w.view(torch.int32), data.w.view(torch.int8), data.d, b, y, part, cnt,
            n, nb, y.stride(0), sbm, scratch.n_blocks)
    kw = dict(HAS_BIAS=has_bias, EVEN=whole_steps(nb, blocks, split), T=tiles, S=blocks, SPLIT=split,
              EVICT="evict_first" if evict_first else "", LOOKAHEAD=lookahead, EARLY=early and pdl,
              num_warps=num_warps, **launch_args(pdl))
    launch_split(_gemv_q6k_mma_kernel, scratch.n_blocks, split, m, 16 * tiles * num_warps, cluster, *args, **kw)
    return y

