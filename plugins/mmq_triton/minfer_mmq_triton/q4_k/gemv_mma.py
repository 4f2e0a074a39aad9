"""The q4_K int8 decode GEMV on tensor cores: ``mma.sync`` (m16n8k32, u8 x s8 -> s32) with
16 weight rows as A and the activation's two int8 digits as B, one B column per (sub-block, digit).

Why: the dp4a kernels (``q4_k.gemv``, ``q6_k.gemv_i8``) spend many instructions per weight byte
(7.6 in q4_K's loop: unpacking, per-word integer sums and their reduction), which kept the 7B's
gate|up and ffn_down GEMVs near 2.2 TB/s; one m16n8k32 instruction does the work of 128 dp4a lanes
(2.3-2.9 instructions per byte here, SASS for sm_90).

Mapping (plane layout: ``q4_k.gemv``; a span ``t`` is 16 words per row). Lane ``4g + c`` of a
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
from ..ops.quant_x import as_words, form_buffers, quantize_x, two_digits
from ..tiles import glu_fits
from .plane import Q4KPlane

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


@gluon.jit
def _weight_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, qa_off, qb_off, sc_off, dm_off, asp, hsp, EVEN: gl.constexpr):
    """The weight words step ``t0`` (spans ``t0 .. t0 + S - 1``, none at or past ``hi`` unless EVEN) reads:
    quant words of rows g / g + 8 and scale words. The quant words, read once, leave L1 first
    (``evict_first``), so x and the scale sectors that the next step reads again stay there
    (``tiles.q6k_evict_first``). No kernel writes them: they may load before the PDL wait."""
    if EVEN:
        qa = gl.load(qw_ptr + qa_off + t0 * 16, eviction_policy="evict_first")
        qb = gl.load(qw_ptr + qb_off + t0 * 16, eviction_policy="evict_first")
        scw = gl.load(sc_ptr + sc_off + t0 * 2)
        dmw = gl.load(dm_ptr + dm_off + (t0 + hsp) // 2)
    else:
        tm6 = (t0 + asp) < hi
        tmh = (t0 + hsp) < hi
        qa = gl.load(qw_ptr + qa_off + t0 * 16, mask=tm6, other=0, eviction_policy="evict_first")
        qb = gl.load(qw_ptr + qb_off + t0 * 16, mask=tm6, other=0, eviction_policy="evict_first")
        scw = gl.load(sc_ptr + sc_off + t0 * 2, mask=tmh, other=0)
        dmw = gl.load(dm_ptr + dm_off + (t0 + hsp) // 2, mask=tmh, other=0)
    return qa, qb, scw, dmw


@gluon.jit
def _x_loads(t0, hi, xs_ptr, x16_ptr, x_src, asp, hsp, x_valid, x_run, xb_off, EVEN: gl.constexpr):
    """What step ``t0`` reads of x: its block scales and sums, the lane's x run."""
    xb = xb_off + t0 * 4
    if EVEN:
        xs = gl.load(xs_ptr + xb)
        xa = gl.load(x16_ptr + 2 * xb) + gl.load(x16_ptr + 2 * xb + 1)
        xv = gl.load(x_src + t0 * 32 + x_run, mask=x_valid, other=0)
    else:
        tm6 = (t0 + asp) < hi
        tmh = (t0 + hsp) < hi
        xs = gl.load(xs_ptr + xb, mask=tmh, other=0.0)
        xa = gl.load(x16_ptr + 2 * xb, mask=tmh, other=0.0) + gl.load(x16_ptr + 2 * xb + 1, mask=tmh, other=0.0)
        xv = gl.load(x_src + t0 * 32 + x_run, mask=x_valid & tm6, other=0)
    return xs, xa, xv


@gluon.jit
def _step_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off, dm_off,
                asp, hsp, x_valid, x_run, xb_off, EVEN: gl.constexpr):
    """Everything step ``t0`` reads (:func:`_weight_loads`, :func:`_x_loads`)."""
    qa, qb, scw, dmw = _weight_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, qa_off, qb_off, sc_off, dm_off, asp, hsp, EVEN)
    xs, xa, xv = _x_loads(t0, hi, xs_ptr, x16_ptr, x_src, asp, hsp, x_valid, x_run, xb_off, EVEN)
    return qa, qb, scw, dmw, xs, xa, xv


@gluon.jit
def _step_acc(acc, cur, low_col, sc_shift, hi_sub, LH: gl.constexpr):
    """``acc`` plus one step's scaled sub-block sums (``cur``: :func:`_step_loads`)."""
    qa, qb, scw, dmw, xs, xa, xv = cur
    W: gl.constexpr = gl.num_warps()
    T: gl.constexpr = qa.shape[1]
    S: gl.constexpr = qa.shape[2]
    b0 = gl.where(low_col, xv, 0)
    b1 = gl.where(low_col, 0, xv)
    sums = _span_sums(qa, qb, b0, b1)  # [W, T, S, 8, 4, 4]: row g (h, l), row g + 8 (h, l)
    h, l = gl.split(gl.reshape(sums, [W, T, S, 8, 4, 2, 2]))
    v = gl.convert_layout(h, LH).to(gl.float32) + gl.convert_layout(l, LH).to(gl.float32) * (1.0 / 256.0)
    d = (dmw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    dmin = ((dmw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
    sc = ((scw >> sc_shift) & 0xFF).to(gl.float32)
    mn = ((scw >> (sc_shift + 8)) & 0xFF).to(gl.float32)
    return acc + ((d * sc) * (v * (xs * hi_sub)) - (dmin * mn) * xa)


@gluon.jit
def _tile_row(i, pid, N, BN: gl.constexpr, TILES: gl.constexpr, GLU: gl.constexpr):
    """First weight row of tile ``i`` of program ``pid`` (``TILES`` 16-row tiles a program): the
    program's ``BN`` rows in a run, or under GLU its first half of tiles in the gate rows
    ``[0, N / 2)`` and its second half at the same place in the up rows ``[N / 2, N)``."""
    if GLU:
        return (i // (TILES // 2)) * (N // 2) + pid * (BN // 2) + (i % (TILES // 2)) * 16
    else:
        return pid * BN + i * 16


@gluon.jit
def _store_glu(y, xm, pid, K, oh_ptr, ol_ptr, os_ptr, o16_ptr, TILES: gl.constexpr):
    """``silu(g) * u`` of a GLU program's sums ``y`` [W, T, 8, 2] (gate rows in its first half of
    tiles, the matching up rows in the second) as blocks of ``quant_x.FORM`` of activation row ``xm``
    (a row of ``K`` values): the digits of ``quant_x.two_digits``, the block scale, the 16-value sums."""
    W: gl.constexpr = gl.num_warps()
    HALF: gl.constexpr = TILES * 8  # values of silu(g) * u
    NB: gl.constexpr = HALF // 32
    # value (tile i, g, h) is row 16 (i % (TILES / 2)) + 8 h + g of the gate (i < TILES / 2) or up half
    yg = gl.permute(gl.reshape(y, [2, TILES // 2, 8, 2]), [1, 3, 2, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 2], [32, 1], [W, 1], [1, 0])
    g, u = gl.split(gl.convert_layout(gl.reshape(yg, [HALF, 2]), LP))
    v = g * (1.0 / (1.0 + gl.exp(-g))) * u
    LB: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 2, 16], [W, 1, 1], [2, 1, 0])
    v = gl.convert_layout(gl.reshape(v, [NB, 2, 16]), LB)
    amax = gl.max(gl.max(gl.abs(v), axis=2), axis=1)
    h, lo = two_digits(v, amax)
    blk = pid * NB + ax(NB, 0, 3, LB)
    off = xm.to(gl.int64) * K + blk * 32 + ax(2, 1, 3, LB) * 16 + ax(16, 2, 3, LB)
    gl.store(oh_ptr + off, h.to(gl.int8))
    gl.store(ol_ptr + off, lo.to(gl.int8))
    LS: gl.constexpr = gl.SliceLayout(2, LB)
    s16 = gl.sum(v, axis=2)  # [NB, 2]
    gl.store(o16_ptr + xm.to(gl.int64) * (K // 16) + (pid * NB + ax(NB, 0, 2, LS)) * 2 + ax(2, 1, 2, LS), s16)
    LA: gl.constexpr = gl.SliceLayout(1, LS)
    gl.store(os_ptr + xm.to(gl.int64) * (K // 32) + pid * NB + gl.arange(0, NB, layout=LA), amax / 127.0)


@gluon.jit
def _gemv_q4p_mma_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    oh_ptr, ol_ptr, os_ptr, o16_ptr,
    N, NT, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    LOOKAHEAD: gl.constexpr, PDL: gl.constexpr, GLU: gl.constexpr = False, CLUSTER: gl.constexpr = False,
    EARLY: gl.constexpr = False,
):
    """Grid (cdiv(N, 16 T num_warps), SPLIT, M), or with CLUSTER ``(cdiv(N, BN), 1, M)`` in clusters of
    SPLIT (``launch.cluster``): one program of :func:`gemv_q4p_mma_program`."""
    pid, s_id = split_ids(SPLIT, CLUSTER)
    gemv_q4p_mma_program(pid, s_id, gl.program_id(2), xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr,
                         bias_ptr, y_ptr, part_ptr, cnt_ptr, oh_ptr, ol_ptr, os_ptr, o16_ptr, N, NT, stride_ym,
                         stride_bm, n_blocks, HAS_BIAS, EVEN, T, S, SPLIT, LOOKAHEAD, PDL, GLU, CLUSTER, EARLY)


@gluon.jit
def gemv_q4p_mma_program(
    pid, s_id, xm, xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    oh_ptr, ol_ptr, os_ptr, o16_ptr, N, NT, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, T: gl.constexpr, S: gl.constexpr, SPLIT: gl.constexpr,
    LOOKAHEAD: gl.constexpr, PDL: gl.constexpr, GLU: gl.constexpr, CLUSTER: gl.constexpr, EARLY: gl.constexpr,
):
    """Program ``(pid, s_id)`` (row block, split) for activation row ``xm``: a warp owns T tiles of 16
    rows; a step is S spans.
    LOOKAHEAD: request step k + 1 before the arithmetic of step k (registers hold both).
    GLU (a ``[gate | up]`` weight, SPLIT 1, no bias): the program's tiles pair gate and up rows
    (:func:`_tile_row`) and it also writes ``silu(g) * u`` in ``quant_x.FORM`` (``oh_ptr`` ..).
    CLUSTER: the SPLIT programs of a row block are a cluster (``launch.cluster``).
    EARLY: the first step's weight words load before the PDL wait (its x after it), so they are on their
    way while the previous kernel ends; same bits."""
    W: gl.constexpr = gl.num_warps()
    BN: gl.constexpr = 16 * T * W
    # axes [warp, tile, span, g, c, e]; e: word of the lane's 16-byte run (L6) or row half (LH)
    L6: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 4], [1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1],
                                        [5, 4, 3, 2, 1, 0])
    LH: gl.constexpr = gl.BlockedLayout([1, T, S, 1, 1, 2], [1, 1, 1, 8, 4, 1], [W, 1, 1, 1, 1, 1],
                                        [5, 4, 3, 2, 1, 0])
    LY: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, LH))  # [W, T, 8, 2]

    # quant words: lane (g, c) reads words 4c .. 4c + 3 of rows g and g + 8 of each tile, S spans
    aw, at, asp = ax(W, 0, 6, L6), ax(T, 1, 6, L6), ax(S, 2, 6, L6)
    ag, ac, ae = ax(8, 3, 6, L6), ax(4, 4, 6, L6), ax(4, 5, 6, L6)
    row_g = _tile_row(aw * T + at, pid, N, BN, W * T, GLU) + ag
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
    hw, ht, hsp = ax(W, 0, 6, LH), ax(T, 1, 6, LH), ax(S, 2, 6, LH)
    hg, hc, hh = ax(8, 3, 6, LH), ax(4, 4, 6, LH), ax(2, 5, 6, LH)
    r_h = gl.minimum(_tile_row(hw * T + ht, pid, N, BN, W * T, GLU) + hg + 8 * hh, N - 1).to(gl.int64)
    sc_off = r_h * (NT * 2) + hsp * 2 + hc // 2  # word 2t + c // 2 holds sub-block 4t + c
    sc_shift = (hc % 2) * 16
    dm_off = r_h * (NT // 2)
    hi_sub = gl.where(hc >= 2, 1.0 / 16.0, 1.0)  # the high nibbles were kept in place: 16x

    per = gl.cdiv(gl.cdiv(NT, SPLIT), S) * S
    lo = s_id * per
    hi = gl.minimum(lo + per, NT)
    if EARLY:  # the first step's weight words load before the wait (no kernel writes them)
        w0 = _weight_loads(lo, hi, qw_ptr, sc_ptr, dm_ptr, qa_off, qb_off, sc_off, dm_off, asp, hsp, EVEN)
    enter(PDL, False)  # the next kernel launches when the loop is done (launch.pdl)
    x_src = gl.where(digit_h, xh_ptr, xl_ptr) + xm * (NT * 32)  # [1, 1, 1, 8, 1, 1] lane's x digit row
    xb_off = xm * (NT * 4) + hsp * 4 + hc  # [1, 1, S, 1, 4, 1]: x block of sub-block 4t + c, t = step + s
    acc = gl.zeros([W, T, S, 8, 4, 2], gl.float32, layout=LH)
    if EARLY:
        qa, qb, scw, dmw = w0
        xs, xa, xv = _x_loads(lo, hi, xs_ptr, x16_ptr, x_src, asp, hsp, x_valid, x_run, xb_off, EVEN)
        first = (qa, qb, scw, dmw, xs, xa, xv)
    if LOOKAHEAD:
        if EARLY:
            cur = first
        else:
            cur = _step_loads(lo, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off, dm_off,
                              asp, hsp, x_valid, x_run, xb_off, EVEN)
        for t0 in range(lo, hi, S):  # the next step's loads go out before this step's arithmetic
            t_next = t0 + S
            if EVEN:
                t_next = gl.minimum(t_next, hi - S)  # the last step re-reads itself (in bounds)
            nxt = _step_loads(t_next, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off,
                              dm_off, asp, hsp, x_valid, x_run, xb_off, EVEN)
            acc = _step_acc(acc, cur, low_col, sc_shift, hi_sub, LH)
            cur = nxt
    else:
        start = lo
        if EARLY:  # the first step apart, from the words loaded before the wait
            acc = _step_acc(acc, first, low_col, sc_shift, hi_sub, LH)
            start = lo + S
        for t0 in range(start, hi, S):
            cur = _step_loads(t0, hi, qw_ptr, sc_ptr, dm_ptr, xs_ptr, x16_ptr, x_src, qa_off, qb_off, sc_off, dm_off,
                              asp, hsp, x_valid, x_run, xb_off, EVEN)
            acc = _step_acc(acc, cur, low_col, sc_shift, hi_sub, LH)
    release(PDL)
    y = gl.sum(gl.sum(acc, axis=4), axis=2)  # [W, T, 8, 2]
    rows = _tile_row(ax(W, 0, 4, LY) * T + ax(T, 1, 4, LY), pid, N, BN, W * T, GLU) + ax(8, 2, 4, LY) \
        + 8 * ax(2, 3, 4, LY)
    store_split_rows(y, rows, N, xm, pid, s_id, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
                     HAS_BIAS, SPLIT, CLUSTER, BN)
    if GLU:
        _store_glu(y, xm, pid, N // 2, oh_ptr, ol_ptr, os_ptr, o16_ptr, W * T)


def gemv_q4p_mma(x: torch.Tensor, plane: Q4KPlane, bias, tiles: int, spans: int, num_warps: int, split: int,
                 scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
                 pdl: bool = False, lookahead: bool = False, xq: tuple | None = None, glu: bool = False,
                 cluster: bool = False, early: bool = False, max_regs: int | None = None):
    """``x`` float32 ``(M, K)`` -> float32 ``(M, N)`` (the contract of ``q4_k.gemv.gemv_q4p`` with
    ``int8=True``); ``scratch`` built for ``BN = mma_rows(tiles, num_warps)``; ``xq``: x already in
    ``quant_x.FORM`` (as ``quantize_x`` returns it; no norm or SwiGLU then). ``glu`` (a ``[gate | up]``
    weight, :func:`glu_fits`; no bias, residual or split): returns ``(y, form)``, ``form`` being
    ``silu(g) * u`` of ``y``'s halves in ``quant_x.FORM``, written by the same kernel. ``cluster``: a split
    row block runs as one cluster (``launch.cluster``; compute capability 9.0+). ``early``: the first step's
    weight words before the PDL wait (with ``pdl``); ``max_regs``: ptxas's register cap (``tiles.mma_max_regs``)."""
    n, half_k = plane.qs.shape
    nt = half_k // 64
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl) if xq is None else xq
    qw32, sc32, dm32 = plane.words()
    if glu:
        assert glu_fits(n, tiles, num_warps, split) and not has_bias, "GLU: whole row pairs, no bias, no split"
        form = form_buffers(m, n // 2, x.device)
    else:
        form = (y, y, y, y)  # not written
    args = (xh, xl, xs, x16, qw32, sc32, dm32, b, y, part, cnt, *form, n, nt, y.stride(0), sbm, scratch.n_blocks)
    kw = dict(HAS_BIAS=has_bias, EVEN=whole_steps(nt, spans, split), T=tiles, S=spans, SPLIT=split,
              LOOKAHEAD=lookahead, GLU=glu, EARLY=early and pdl, num_warps=num_warps,
              **({"maxnreg": max_regs} if max_regs else {}), **launch_args(pdl))
    launch_split(_gemv_q4p_mma_kernel, scratch.n_blocks, split, m, 16 * tiles * num_warps, cluster, *args, **kw)
    return (y, as_words(*form)) if glu else y

