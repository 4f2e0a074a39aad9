"""Gluon helpers shared by the tensor-core kernels (the decode GEMVs ``q4_k.gemv_mma``, ``q6_k.gemv_mma``,
and the batched step's ``q4_k.gemm_mma``)."""

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
