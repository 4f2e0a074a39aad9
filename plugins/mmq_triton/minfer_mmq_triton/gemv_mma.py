"""The q4_K and q6_K int8 decode GEMVs on tensor cores: ``mma.sync`` (m16n8k32, u8 x s8 -> s32) with
16 weight rows as A and the activation's two int8 digits as B, one B column per (sub-block, digit).

Why: the dp4a kernels (``gemv_q4plane``, ``gemv_q8dot``) spend many instructions per weight byte
(7.6 in q4_K's loop: unpacking, per-word integer sums and their reduction), which kept the 7B's
gate|up and ffn_down GEMVs near 2.2 TB/s; one m16n8k32 instruction does the work of 128 dp4a lanes
(2.3-2.9 instructions per byte here, SASS for sm_90).

Mapping (plane layout: ``gemv_q4plane``; a span ``t`` is 16 words per row). Lane ``4g + c`` of a
warp holds, for rows ``g`` and ``g + 8`` of a 16-row tile, the span's words ``4c .. 4c + 3``.
MMA ``i`` (``i < 4``) of the span takes word ``4c + i`` of each row as its A registers: its low
nibbles (``& 0x0F0F0F0F``) at k = ``4c .. 4c + 3`` and its high nibbles, kept in place
(``& 0xF0F0F0F0``, 16x the value), at k = ``16 + 4c ..``. Word ``4c + i`` is word ``8j + w`` with
``j = c // 2``, ``w = 4 (c % 2) + i``: its low nibbles belong to sub-block ``4t + j``, its high ones
to ``4t + 2 + j``. So over the four MMAs each k row of A belongs to one sub-block ``s`` in 0..3
(``s = c // 2`` low, ``2 + c // 2`` high), and B column ``2 s + d`` holds x's digit ``d`` (h, l)
where k is in sub-block ``s`` and zero elsewhere. The accumulator's column ``2 c + d`` (lane ``4g + c``
holds columns ``2c, 2c + 1``) is then the integer sum of sub-block ``4t + c``, digit ``d``, for rows
``g`` and ``g + 8``: each lane scales whole sub-blocks (``1/16`` for the high ones), as the dp4a
kernels do, and lanes are summed once at the end.

B in lane ``4g + c``: column ``g`` (sub-block ``g // 2``, digit ``g % 2``); its k rows ``4c ..`` are
in sub-block ``c // 2`` and ``16 + 4c ..`` in ``2 + c // 2``, so a lane holds one 16-byte run of x
(or zeros) per span, shared by every row tile.

q6_K (decode plane: ``gemv_pack.Q6KDecodePlane``, 208 bytes a block: ``ql`` words 0..31, ``qh``
words 32..47, int8 scales at bytes 192..207). Value ``128h + 32k + 16s + 4w + (0..3)`` (``h, s < 2``,
``k, w < 4``) is the 6-bit ``u = ql | qh << 4`` of nibble ``k // 2`` of ``ql`` word
``16h + 8(k % 2) + 4s + w`` and bits ``2k, 2k + 1`` of ``qh`` word ``32 + 8h + 4s + w``; the 16 values of
``(h, k, s)`` share scale byte ``8h + 2k + s``; ``q = u - 32``. A group ``(h, s)`` is four sub-blocks
``k = 0..3``, two MMAs ``m``: lane ``4g + c`` puts ``u`` of word ``w = 2(c % 2) + m`` for ``k = c // 2``
(from the low nibbles) at k rows ``4c ..`` and for ``k = 2 + c // 2`` (high nibbles, same ``ql`` word)
at ``16 + 4c ..``, so the B columns and the accumulator read as for q4_K with ``s`` = k. The offset:
``sum q x = sum u x - 32 sum x`` per 16 values.

Same arithmetic as the dp4a kernels (exact integer sub-block sums, scaled in float32); the float
summation order differs; the PDL entry (``pdl.enter``) and the split-K store (``gemv_split.store_rows``)
are the Triton kernels' own. Gluon, CUDA only (compute capability 8.0+).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gemv_q8dot import quantize_x
from .gemv_split import SplitScratch, bias_or_residual, store_rows, whole_steps
from .pdl import enter
from .planes import Q4KPlane

_MMA4 = gl.constexpr("""{
.reg .b32 a<4>, z;
mov.b32 z, 0;
and.b32 a0, $4, 0x0F0F0F0F; and.b32 a1, $8, 0x0F0F0F0F; and.b32 a2, $4, 0xF0F0F0F0; and.b32 a3, $8, 0xF0F0F0F0;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$12, $16}, {z, z, z, z};
and.b32 a0, $5, 0x0F0F0F0F; and.b32 a1, $9, 0x0F0F0F0F; and.b32 a2, $5, 0xF0F0F0F0; and.b32 a3, $9, 0xF0F0F0F0;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$13, $17}, {$0, $1, $2, $3};
and.b32 a0, $6, 0x0F0F0F0F; and.b32 a1, $10, 0x0F0F0F0F; and.b32 a2, $6, 0xF0F0F0F0; and.b32 a3, $10, 0xF0F0F0F0;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$14, $18}, {$0, $1, $2, $3};
and.b32 a0, $7, 0x0F0F0F0F; and.b32 a1, $11, 0x0F0F0F0F; and.b32 a2, $7, 0xF0F0F0F0; and.b32 a3, $11, 0xF0F0F0F0;
mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {$0, $1, $2, $3}, {a0, a1, a2, a3}, {$15, $19}, {$0, $1, $2, $3};
}""")
_MMA4_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 16))


@gluon.jit
def _span_sums(qa, qb, b0, b1):
    """Four MMAs over one span: ``[..., 4]`` words of rows g (``qa``) and g + 8 (``qb``), B registers
    ``b0`` / ``b1`` -> ``[..., 4]``: (row g: h, l; row g + 8: h, l) sums of the lane's sub-block."""
    return gl.inline_asm_elementwise(_MMA4, _MMA4_CONSTRAINTS, [qa, qb, b0, b1],
                                     dtype=gl.int32, is_pure=True, pack=4)


@gluon.constexpr_function
def _axis_layout(layout, rank, axis):
    """The 1-D layout of ``layout``'s axis ``axis`` (every other axis sliced away, highest first)."""
    for d in reversed(range(rank)):
        if d != axis:
            layout = gl.SliceLayout(d, layout)
    return layout


@gluon.jit
def _ax(n: gl.constexpr, axis: gl.constexpr, rank: gl.constexpr, layout: gl.constexpr):
    """``arange(n)`` along ``axis`` of a rank-``rank`` tensor in ``layout`` (size 1 elsewhere)."""
    x = gl.arange(0, n, layout=_axis_layout(layout, rank, axis))
    for d in gl.static_range(rank):
        if d != axis:
            x = gl.expand_dims(x, d)
    return x


@gluon.jit
def _step_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off, dm_off,
                asp, hsp, x_valid, x_run, xb_off, EVEN: gl.constexpr):
    """Everything step ``t0`` (spans ``t0 .. t0 + S - 1``, none at or past ``hi`` unless EVEN) reads:
    quant words of rows g / g + 8, scale words, x block scales and sums, the lane's x run."""
    xb = xb_off + t0 * 4
    if EVEN:
        qa = gl.load(qw_ptr + qa_off + t0 * 16)
        qb = gl.load(qw_ptr + qb_off + t0 * 16)
        scw = gl.load(sc_ptr + sc_off + t0 * 2)
        dmw = gl.load(dm_ptr + dm_off + (t0 + hsp) // 2)
        xs = gl.load(xs_ptr + xb)
        xa = gl.load(x16_ptr + 2 * xb) + gl.load(x16_ptr + 2 * xb + 1)
        xv = gl.load(x_src + t0 * 32 + x_run, mask=x_valid, other=0)
    else:
        tm6 = (t0 + asp) < hi
        tmh = (t0 + hsp) < hi
        qa = gl.load(qw_ptr + qa_off + t0 * 16, mask=tm6, other=0)
        qb = gl.load(qw_ptr + qb_off + t0 * 16, mask=tm6, other=0)
        scw = gl.load(sc_ptr + sc_off + t0 * 2, mask=tmh, other=0)
        dmw = gl.load(dm_ptr + dm_off + (t0 + hsp) // 2, mask=tmh, other=0)
        xs = gl.load(xs_ptr + xb, mask=tmh, other=0.0)
        xa = gl.load(x16_ptr + 2 * xb, mask=tmh, other=0.0) + gl.load(x16_ptr + 2 * xb + 1, mask=tmh, other=0.0)
        xv = gl.load(x_src + t0 * 32 + x_run, mask=x_valid & tm6, other=0)
    return qa, qb, scw, dmw, xs, xa, xv


@gluon.jit
def _gemv_q4p_mma_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NT, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    LOOKAHEAD: gl.constexpr, PDL: gl.constexpr,
):
    """Grid (cdiv(N, 16 T num_warps), SPLIT, M): a warp owns T tiles of 16 rows; a step is S spans.
    LOOKAHEAD: request step k + 1 before the arithmetic of step k (registers hold both)."""
    W: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = 16 * T * W
    # axes [warp, tile, span, g, c, e]; e: word of the lane's 16-byte run (L6) or row half (LH)
    L6: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 4], [1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1],
                                        [5, 4, 3, 2, 1, 0])
    LH: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 2], [1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1],
                                        [5, 4, 3, 2, 1, 0])
    LY: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, LH))  # [W, T, 8, 2]

    pid = gl.program_id(0)
    s_id = gl.program_id(1)
    xm = gl.program_id(2)

    # quant words: lane (g, c) reads words 4c .. 4c + 3 of rows g and g + 8 of each tile, S spans
    aw, at, asp = _ax(W, 0, 6, L6), _ax(T, 1, 6, L6), _ax(S, 2, 6, L6)
    ag, ac, ae = _ax(8, 3, 6, L6), _ax(4, 4, 6, L6), _ax(4, 5, 6, L6)
    row_g = pid * BN + (aw * T + at) * 16 + ag
    qa_off = gl.minimum(row_g, N - 1).to(gl.int64) * (NT * 16) + asp * 16 + ac * 4 + ae
    qb_off = gl.minimum(row_g + 8, N - 1).to(gl.int64) * (NT * 16) + asp * 16 + ac * 4 + ae
    # B: lane (g, c) holds digit g % 2 of x's run at word 4c (+ 16: high sub-blocks) of each span
    # when that run lies in column g's sub-block g // 2, else zeros
    gs = ag // 2
    x_valid = (gs % 2) == (ac // 2)
    x_run = asp * 32 + ac * 4 + (gs // 2) * 16 + ae
    low_col = gs < 2
    digit_h = (ag % 2) == 0
    # scale words per (row half, span, lane's sub-block c): [W, T, S, 8, 4, 2]
    hw, ht, hsp = _ax(W, 0, 6, LH), _ax(T, 1, 6, LH), _ax(S, 2, 6, LH)
    hg, hc, hh = _ax(8, 3, 6, LH), _ax(4, 4, 6, LH), _ax(2, 5, 6, LH)
    r_h = gl.minimum(pid * BN + (hw * T + ht) * 16 + hg + 8 * hh, N - 1).to(gl.int64)
    sc_off = r_h * (NT * 2) + hsp * 2 + hc // 2  # word 2t + c // 2 holds sub-block 4t + c
    sc_shift = (hc % 2) * 16
    dm_off = r_h * (NT // 2)
    hi_sub = gl.where(hc >= 2, 1.0 / 16.0, 1.0)  # the high nibbles were kept in place: 16x

    per = gl.cdiv(gl.cdiv(NT, SPLIT), S) * S
    lo = s_id * per
    hi = gl.minimum(lo + per, NT)
    enter(PDL)
    x_src = gl.where(digit_h, xh_ptr, xl_ptr) + xm * (NT * 32)  # [1, 1, 1, 8, 1, 1] lane's x digit row
    xb_off = xm * (NT * 4) + hsp * 4 + hc  # [1, 1, S, 1, 4, 1]: x block of sub-block 4t + c, t = step + s
    acc = gl.zeros([W, T, S, 8, 4, 2], gl.float32, layout=LH)
    if LOOKAHEAD:
        cur = _step_loads(lo, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off, dm_off,
                          asp, hsp, x_valid, x_run, xb_off, EVEN)
    for t0 in range(lo, hi, S):
        if LOOKAHEAD:  # the next step's loads go out before this step's arithmetic
            t_next = t0 + S
            if EVEN:
                t_next = gl.minimum(t_next, hi - S)  # the last step re-reads itself (in bounds)
            nxt = _step_loads(t_next, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off,
                              dm_off, asp, hsp, x_valid, x_run, xb_off, EVEN)
        else:
            cur = _step_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off,
                              dm_off, asp, hsp, x_valid, x_run, xb_off, EVEN)
        qa, qb, scw, dmw, xs, xa, xv = cur
        b0 = gl.where(low_col, xv, 0)
        b1 = gl.where(low_col, 0, xv)
        sums = _span_sums(qa, qb, b0, b1)  # [W, T, S, 8, 4, 4]: row g (h, l), row g + 8 (h, l)
        h, l = gl.split(gl.reshape(sums, [W, T, S, 8, 4, 2, 2]))
        v = gl.convert_layout(h, LH).to(gl.float32) + gl.convert_layout(l, LH).to(gl.float32) * (1.0 / 256.0)
        d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        dmin = ((dmw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        sc = ((scw >> sc_shift) & 0xFF).to(gl.float32)
        mn = ((scw >> (sc_shift + 8)) & 0xFF).to(gl.float32)
        acc += (d * sc) * (v * (xs * hi_sub)) - (dmin * mn) * xa
        if LOOKAHEAD:
            cur = nxt
    y = gl.sum(gl.sum(acc, axis=4), axis=2)  # [W, T, 8, 2]
    rows = pid * BN + (_ax(W, 0, 4, LY) * T + _ax(T, 1, 4, LY)) * 16 + _ax(8, 2, 4, LY) + 8 * _ax(2, 3, 4, LY)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def mma_rows(tiles: int, num_warps: int) -> int:
    """Rows a program of the MMA GEMV covers."""
    return 16 * tiles * num_warps


def gemv_q4p_mma(x: torch.Tensor, plane: Q4KPlane, bias, tiles: int, spans: int, num_warps: int, split: int,
                 scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
                 pdl: bool = False, lookahead: bool = False) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` -> float32 ``(M, N)`` (the contract of ``gemv_q4plane.gemv_q4p`` with
    ``int8=True``); ``scratch`` built for ``BN = mma_rows(tiles, num_warps)``."""
    n, half_k = plane.qs.shape
    nt = half_k // 64
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl)
    qw32, sc32, dm32 = plane.words()
    extra = {"launch_pdl": True} if pdl else {}
    _gemv_q4p_mma_kernel[(scratch.n_blocks, split, m)](
        xh, xl, xs, x16, qw32, sc32, dm32, b, y, part, cnt,
        n, nt, y.stride(0), sbm, scratch.n_blocks,
        HAS_BIAS=has_bias, EVEN=whole_steps(nt, spans, split), T=tiles, S=spans, SPLIT=split, LOOKAHEAD=lookahead,
        PDL=pdl, num_warps=num_warps, **extra)
    return y


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
def _gemv_q6k_mma_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, w8_ptr, d_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NB, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    PDL: gl.constexpr,
):
    """Grid (cdiv(N, 16 T num_warps), SPLIT, M): a warp owns T tiles of 16 rows; a step is S blocks."""
    W: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = 16 * T * W
    # axes [warp, tile, block, g, c, group (h, s), m]
    L7: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 4, 2], [1, 1, 1, 8, 4, 1, 1], [W, 1, 1, 1, 1, 1, 1],
                                        [6, 5, 4, 3, 2, 1, 0])
    L6: gl.constexpr = gl.SliceLayout(6, L7)  # [W, T, S, 8, 4, 4]
    LY: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, L6)))  # [W, T, 8]

    pid = gl.program_id(0)
    s_id = gl.program_id(1)
    xm = gl.program_id(2)

    aw, at, ab = _ax(W, 0, 7, L7), _ax(T, 1, 7, L7), _ax(S, 2, 7, L7)
    ag, ac, agr, am = _ax(8, 3, 7, L7), _ax(4, 4, 7, L7), _ax(4, 5, 7, L7), _ax(2, 6, 7, L7)
    row_g = pid * BN + (aw * T + at) * 16 + ag
    r_g = gl.minimum(row_g, N - 1).to(gl.int64) * (NB * 52)
    r_h = gl.minimum(row_g + 8, N - 1).to(gl.int64) * (NB * 52)
    hh = agr // 2
    ss = agr % 2
    w4 = 2 * (ac % 2) + am
    ql_col = ab * 52 + 16 * hh + 8 * (ac // 2) + 4 * ss + w4  # [1, 1, S, 1, 4, 4, 2] words of step block b
    qh_col = ab * 52 + 32 + 8 * hh + 4 * ss + w4
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
    sw, st, sb = _ax(W, 0, 6, L6), _ax(T, 1, 6, L6), _ax(S, 2, 6, L6)
    sg, sc_, sgr = _ax(8, 3, 6, L6), _ax(4, 4, 6, L6), _ax(4, 5, 6, L6)
    srow = pid * BN + (sw * T + st) * 16 + sg
    sr_g = gl.minimum(srow, N - 1).to(gl.int64)
    sr_h = gl.minimum(srow + 8, N - 1).to(gl.int64)
    sc_col = sb * 208 + 192 + 8 * (sgr // 2) + 2 * sc_ + sgr % 2
    xblk = xm * (NB * 8) + sb * 8 + 4 * (sgr // 2) + sc_
    x16i = 2 * xblk + sgr % 2

    per = gl.cdiv(gl.cdiv(NB, SPLIT), S) * S
    lo = s_id * per
    hi = gl.minimum(lo + per, NB)
    enter(PDL)
    acc_g = gl.zeros([W, T, S, 8, 4, 4], gl.float32, layout=L6)
    acc_h = gl.zeros([W, T, S, 8, 4, 4], gl.float32, layout=L6)
    for b0_ in range(lo, hi, S):
        if EVEN:
            ql_g = gl.load(w32_ptr + r_g + b0_ * 52 + ql_col)
            ql_h = gl.load(w32_ptr + r_h + b0_ * 52 + ql_col)
            qh_g = gl.load(w32_ptr + r_g + b0_ * 52 + qh_col)
            qh_h = gl.load(w32_ptr + r_h + b0_ * 52 + qh_col)
            xv = gl.load(x_src + b0_ * 64 + x_word, mask=x_valid, other=0)
            scg = gl.load(w8_ptr + sr_g * (NB * 208) + b0_ * 208 + sc_col).to(gl.float32)
            sch = gl.load(w8_ptr + sr_h * (NB * 208) + b0_ * 208 + sc_col).to(gl.float32)
            dg = gl.load(d_ptr + sr_g * NB + b0_ + sb).to(gl.float32)
            dh = gl.load(d_ptr + sr_h * NB + b0_ + sb).to(gl.float32)
            xs = gl.load(xs_ptr + xblk + b0_ * 8)
            x16 = gl.load(x16_ptr + x16i + b0_ * 16)
        else:
            bm7 = (b0_ + ab) < hi
            bm6 = (b0_ + sb) < hi
            ql_g = gl.load(w32_ptr + r_g + b0_ * 52 + ql_col, mask=bm7, other=0)
            ql_h = gl.load(w32_ptr + r_h + b0_ * 52 + ql_col, mask=bm7, other=0)
            qh_g = gl.load(w32_ptr + r_g + b0_ * 52 + qh_col, mask=bm7, other=0)
            qh_h = gl.load(w32_ptr + r_h + b0_ * 52 + qh_col, mask=bm7, other=0)
            xv = gl.load(x_src + b0_ * 64 + x_word, mask=x_valid & bm7, other=0)
            scg = gl.load(w8_ptr + sr_g * (NB * 208) + b0_ * 208 + sc_col, mask=bm6, other=0).to(gl.float32)
            sch = gl.load(w8_ptr + sr_h * (NB * 208) + b0_ * 208 + sc_col, mask=bm6, other=0).to(gl.float32)
            dg = gl.load(d_ptr + sr_g * NB + b0_ + sb, mask=bm6, other=0.0).to(gl.float32)
            dh = gl.load(d_ptr + sr_h * NB + b0_ + sb, mask=bm6, other=0.0).to(gl.float32)
            xs = gl.load(xs_ptr + xblk + b0_ * 8, mask=bm6, other=0.0)
            x16 = gl.load(x16_ptr + x16i + b0_ * 16, mask=bm6, other=0.0)
        b0 = gl.where(low_col, xv, 0)
        b1 = gl.where(low_col, 0, xv)
        sg_, sh_ = _group_sums(ql_g, ql_h, qh_g, qh_h, b0, b1, sh0, sh1)  # [.., 2]: (h, l) digit sums
        hg, lg = gl.split(sg_)
        hh_, lh_ = gl.split(sh_)
        vg = gl.convert_layout(hg, L6).to(gl.float32) + gl.convert_layout(lg, L6).to(gl.float32) * (1.0 / 256.0)
        vh = gl.convert_layout(hh_, L6).to(gl.float32) + gl.convert_layout(lh_, L6).to(gl.float32) * (1.0 / 256.0)
        acc_g += (dg * scg) * (vg * xs - 32.0 * x16)
        acc_h += (dh * sch) * (vh * xs - 32.0 * x16)
    y = gl.join(gl.sum(gl.sum(gl.sum(acc_g, axis=5), axis=4), axis=2),
                gl.sum(gl.sum(gl.sum(acc_h, axis=5), axis=4), axis=2))  # [W, T, 8, 2]: rows g, g + 8
    LJ: gl.constexpr = gl.BlockedLayout([1, T, 1, 2], [1, 1, 8, 4], [W, 1, 1, 1], [3, 2, 1, 0])
    y = gl.convert_layout(y, LJ)
    rows = pid * BN + (_ax(W, 0, 4, LJ) * T + _ax(T, 1, 4, LJ)) * 16 + _ax(8, 2, 4, LJ) + 8 * _ax(2, 3, 4, LJ)
    store_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS, SPLIT)


def gemv_q6k_mma(x: torch.Tensor, data, bias, tiles: int, blocks: int, num_warps: int, split: int,
                 scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
                 pdl: bool = False) -> torch.Tensor:
    """A q6_K decode plane (``gemv_pack.Q6KDecodePlane``); the contract of ``gemv_q8dot.gemv_i8``;
    ``scratch`` built for ``BN = mma_rows(tiles, num_warps)``; ``blocks`` 256-value blocks a step."""
    n, nb = data.d.shape
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl)
    extra = {"launch_pdl": True} if pdl else {}
    _gemv_q6k_mma_kernel[(scratch.n_blocks, split, m)](
        xh, xl, xs, x16, data.w.view(torch.int32), data.w.view(torch.int8), data.d, b, y, part, cnt,
        n, nb, y.stride(0), sbm, scratch.n_blocks,
        HAS_BIAS=has_bias, EVEN=whole_steps(nb, blocks, split), T=tiles, S=blocks, SPLIT=split, PDL=pdl,
        num_warps=num_warps, **extra)
    return y
