"""A q4_K and a q6_K weight over the same input in one tensor-core launch: a Q4_K_M layer's q|k
(q4_K) and v (q6_K), which the loader cannot fuse into one weight since their types differ.

Apart, such a layer ran four launches where a layer of one type runs two (the quantizer applying the
RMSNorm, the qkv GEMV): an RMSNorm, the quantizer, q|k's tensor-core GEMV and v's float GEMV (v's
1.5 MB is under ``tiles.INT8_MIN_BYTES_MMA``, where its own tensor-core launch lost). Here x is
quantized once, with the norm, and one grid runs both GEMVs: its first row blocks are q6_K programs
(``q6_k.gemv_mma.gemv_q6k_mma_program``), the rest q4_K programs (``q4_k.gemv_mma.gemv_q4p_mma_program``),
both on ``num_warps`` warps and the same split (a cluster's programs take the same branch). Each part
computes what its own kernel computes at the same tiling, bit for bit. Gluon, CUDA only (compute
capability 8.0+; clusters 9.0+).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .launch.cluster import launch_split, split_ids
from .launch.pdl import launch_args
from .launch.split import SplitScratch, bias_or_residual, whole_steps
from .ops.quant_x import quantize_x
from .q4_k.gemv_mma import gemv_q4p_mma_program
from .q4_k.plane import Q4KPlane
from .q6_k.gemv_mma import gemv_q6k_mma_program


@gluon.jit
def _gemv_pair_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, y_ptr, stride_ym,
    qw_ptr, sc_ptr, dm_ptr, bias4_ptr, part4_ptr, cnt4_ptr, N4, NT, blocks4,
    w32_ptr, w8_ptr, d_ptr, bias6_ptr, part6_ptr, cnt6_ptr, N6, NB, blocks6,
    HAS_BIAS4: gl.constexpr, EVEN4: gl.constexpr, T4: gl.constexpr, S4: gl.constexpr, AHEAD4: gl.constexpr,
    HAS_BIAS6: gl.constexpr, EVEN6: gl.constexpr, T6: gl.constexpr, S6: gl.constexpr, AHEAD6: gl.constexpr,
    EVICT6: gl.constexpr, SPLIT: gl.constexpr, PDL: gl.constexpr, CLUSTER: gl.constexpr = False,
    EARLY: gl.constexpr = False,
):
    """Grid ``(blocks6 + blocks4, SPLIT, M)`` (or clusters of SPLIT, ``launch.cluster``): the first ``blocks6``
    row blocks write columns ``[N4, N4 + N6)`` of ``y`` from the q6_K weight, the others ``[0, N4)`` from the
    q4_K one. The q6_K programs (two dependent loads a step) go first, so they do not finish last."""
    pid, s_id = split_ids(SPLIT, CLUSTER)
    xm = gl.program_id(2)
    if pid < blocks6:
        gemv_q6k_mma_program(pid, s_id, xm, xh_ptr, xl_ptr, xs_ptr, x16_ptr, w32_ptr, w8_ptr, d_ptr,
                             bias6_ptr, y_ptr + N4, part6_ptr, cnt6_ptr, N6, NB, stride_ym, 0, blocks6, HAS_BIAS6,
                             EVEN6, T6, S6, SPLIT, PDL, EVICT6, CLUSTER, AHEAD6, EARLY)
    else:
        gemv_q4p_mma_program(pid - blocks6, s_id, xm, xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr,
                             bias4_ptr, y_ptr, part4_ptr, cnt4_ptr, y_ptr, y_ptr, y_ptr, y_ptr, N4, NT, stride_ym, 0,
                             blocks4, HAS_BIAS4, EVEN4, T4, S4, SPLIT, AHEAD4, PDL, False, CLUSTER, EARLY)


def gemv_pair_mma(x: torch.Tensor, q4: Q4KPlane, bias4, q6, bias6, tiling4: tuple[int, int, int],
                  tiling6: tuple[int, int, int], num_warps: int, split: int, scratch4: SplitScratch,
                  scratch6: SplitScratch, norm=None, pdl: bool = False, evict6: bool = False,
                  cluster: bool = False, early: bool = False) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` -> float32 ``(M, N4 + N6)``: ``[x @ W4.T + b4 | x @ W6.T + b6]``, ``x``
    RMSNormed first under ``norm=(w, eps)``. ``tiling4`` / ``tiling6``: (16-row tiles a warp, spans or
    blocks a step, LOOKAHEAD) of each part, as their own kernels take them; ``scratch4`` / ``scratch6``:
    each part's split scratch (unused under ``cluster``); ``evict6``: the q6_K quant words leave L1 first;
    ``early``: each program's first step of weight words before the PDL wait."""
    n4, half_k = q4.qs.shape
    nt = half_k // 64
    n6, nb = q6.d.shape
    m = x.shape[0]
    (t4, s4, a4), (t6, s6, a6) = tiling4, tiling6
    assert t4 == t6, "one row count a program for both parts (the cluster's shared memory)"
    y = torch.empty(m, n4 + n6, dtype=torch.float32, device=x.device)
    part4, cnt4 = scratch4.get(m, x.device)
    part6, cnt6 = scratch6.get(m, x.device)
    b4, _, has4 = bias_or_residual(bias4, None, y)
    b6, _, has6 = bias_or_residual(bias6, None, y)
    xh, xl, xs, x16 = quantize_x(x, norm, False, pdl)
    qw32, sc32, dm32 = q4.words()
    args = (xh, xl, xs, x16, y, y.stride(0),
            qw32, sc32, dm32, b4, part4, cnt4, n4, nt, scratch4.n_blocks,
            q6.w.view(torch.int32), q6.w.view(torch.int8), q6.d, b6, part6, cnt6, n6, nb, scratch6.n_blocks)
    kw = dict(HAS_BIAS4=has4, EVEN4=whole_steps(nt, s4, split), T4=t4, S4=s4, AHEAD4=bool(a4),
              HAS_BIAS6=has6, EVEN6=whole_steps(nb, s6, split), T6=t6, S6=s6, AHEAD6=bool(a6),
              EVICT6="evict_first" if evict6 else "", SPLIT=split, EARLY=early and pdl, num_warps=num_warps,
              **launch_args(pdl))
    launch_split(_gemv_pair_kernel, scratch4.n_blocks + scratch6.n_blocks, split, m, 16 * t4 * num_warps, cluster,
                 *args, **kw)
    return y
