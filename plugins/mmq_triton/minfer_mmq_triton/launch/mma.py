"""Gluon helpers shared by the tensor-core kernels (the decode GEMVs ``q4_k.gemv_mma``, ``q6_k.gemv_mma``,
and the batched step's ``q4_k.gemm_mma``, ``q6_k.gemm_mma``)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


def mma_rows(tiles: int, num_warps: int) -> int:
    """Rows a program of an MMA GEMV covers: ``tiles`` 16-row tiles per warp."""
    return 16 * tiles * num_warps


@gluon.constexpr_function
def _axis_layout(layout, rank, axis):
    """The 1-D layout of ``layout``'s axis ``axis`` (every other axis sliced away, highest first)."""
    for d in reversed(range(rank)):
        if d != axis:
            layout = gl.SliceLayout(d, layout)
    return layout


@gluon.jit
def ax(n: gl.constexpr, axis: gl.constexpr, rank: gl.constexpr, layout: gl.constexpr):
    """``arange(n)`` along ``axis`` of a rank-``rank`` tensor in ``layout`` (size 1 elsewhere)."""
    x = gl.arange(0, n, layout=_axis_layout(layout, rank, axis))
    for d in gl.static_range(rank):
        if d != axis:
            x = gl.expand_dims(x, d)
    return x


_PREFETCH = gl.constexpr("prefetch.global.L2 [$1]; mov.u32 $0, 0;")


@gluon.jit
def prefetch_l2(p):
    """Ask L2 for the 128-byte line at each address of ``p`` (nothing is loaded into registers)."""
    return gl.inline_asm_elementwise(_PREFETCH, "=r,l", [p], dtype=gl.int32, is_pure=False, pack=1)


# -- the batched step's rows GEMMs (q4_k.gemm_mma, q6_k.gemm_mma) ---------------------------------------

@gluon.constexpr_function
def rows_layout(warps, tiles, groups):
    """A rows GEMM program's accumulator layout, axes ``[warp, tile, group, g, c, r, p]``: lane ``4 g + c``
    of a warp holds weight rows ``g + 8 r`` of each of its ``tiles`` 16-row tiles against activation rows
    ``2 c + p`` of each of the program's ``groups`` 8-row groups (an ``mma.sync`` accumulator's layout)."""
    return gl.BlockedLayout([1, tiles, groups, 1, 1, 2, 2], [1, 1, 1, 8, 4, 1, 1], [warps, 1, 1, 1, 1, 1, 1],
                            [6, 5, 4, 3, 2, 1, 0])


@gluon.jit
def rows_program(L: gl.constexpr, T: gl.constexpr, G: gl.constexpr, M, N):
    """This program's weight rows (clamped to ``N - 1`` as int64 ``row``, and as ``rows``), its lanes'
    B activation rows (``xrow``, clamped, int64) and accumulator activation rows (``cols``), and the lane
    coordinates ``c, r, p``, each broadcastable over layout ``L`` (:func:`rows_layout`)."""
    W: gl.constexpr = gl.num_warps()
    pid_m = gl.program_id(0)
    pid = gl.program_id(1)
    aw, at, ag_ = ax(W, 0, 7, L), ax(T, 1, 7, L), ax(G, 2, 7, L)
    ag, ac, ar, ap = ax(8, 3, 7, L), ax(4, 4, 7, L), ax(2, 5, 7, L), ax(2, 6, 7, L)
    rows = pid * (16 * T * W) + (aw * T + at) * 16 + ag + 8 * ar
    row = gl.minimum(rows, N - 1).to(gl.int64)
    xrow = gl.minimum((pid_m * G + ag_) * 8 + ag, M - 1).to(gl.int64)
    cols = (pid_m * G + ag_) * 8 + ac * 2 + ap
    return rows, row, xrow, cols, ac, ar, ap


@gluon.jit
def rows_prefetch_rows(L: gl.constexpr, T: gl.constexpr, N):
    """One weight row a lane (``[warp, tile, g, r]``, clamped, int64): the rows an L2 prefetch asks for."""
    W: gl.constexpr = gl.num_warps()
    LP: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(4, gl.SliceLayout(6, L)))
    prow = gl.program_id(1) * (16 * T * W) + (ax(W, 0, 4, LP) * T + ax(T, 1, 4, LP)) * 16 + ax(8, 2, 4, LP) \
        + 8 * ax(2, 3, 4, LP)
    return gl.minimum(prow, N - 1).to(gl.int64)


@gluon.jit
def rows_store(acc, rows, cols, M, N, bias_ptr, res_ptr, y_ptr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr,
               SPLIT: gl.constexpr):
    """``y`` (M, N) ``= acc [+ bias] [+ residual]``, or with SPLIT > 1 this split's partial in (SPLIT, M, N)
    (the reduction adds bias and residual)."""
    mask = (rows < N) & (cols < M)
    out = cols.to(gl.int64) * N + rows
    if SPLIT == 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + rows, mask=mask, other=0.0)
        if HAS_RES:
            acc += gl.load(res_ptr + out, mask=mask, other=0.0)
        gl.store(y_ptr + out, acc, mask=mask)
    else:
        gl.store(y_ptr + gl.program_id(2) * M * N + out, acc, mask=mask)
