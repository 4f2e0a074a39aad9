"""q4_K / q6_K GEMMs of more than 64 rows on Hopper's warpgroup MMA, the activations streamed through
a ring of shared-memory slots and the MMAs issued asynchronously (``tiles.async_route`` says where
it serves).

Same arithmetic as ``prefill.gemm_wgmma`` (read its docstring first): the weights are decoded in f16x2
straight into the wgmma's A registers, the activations are staged once a call (float16, PERM order)
and multiplied from shared memory. What differs is the schedule:

- A program owns ``64 WG`` weight rows (``WG`` warpgroups; all of them share the activation tile) and
  ``NA`` activation rows (the MMA's N); a grid axis walks the activation rows ``NA`` at a time.
- The activations of each 128-value span are copied into a ring of ``STAGES`` shared-memory slots
  (``cp.async``), ``STAGES - 1`` spans ahead of the span being multiplied; no thread waits for a copy
  it did not need yet.
- Span ``t``'s two MMAs are issued without waiting; while the tensor cores work, the warps start the
  copy of span ``t + STAGES - 1`` (into the slot span ``t - 1`` used) and the loads of span ``t + 1``'s
  weights, then wait for the MMAs before decoding span ``t + 1`` into the same registers (the A
  operand's registers must not change while an MMA may still read them). Up to three programs share
  a multiprocessor (registers, shared memory).

Each activation row is one column of the MMA and the split-K meets in a fixed order, so a row's bits
do not depend on the other rows of the call. Gluon, CUDA only (compute capability 9.0).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from .. import tiles
from ..launch.pdl import enter, launch_args
from ..launch.rows import reduce_splits
from .gemm_wgmma import (_decode, _span_words, _to_fragment, glu_outputs, outputs, plane_words, stage, store_tile,
                         tile_rows)


def _bytes_layout(wg: int) -> gl.DistributedLinearLayout:
    """``prefill.gemm_wgmma.BYTES`` for ``64 wg`` weight rows (warpgroup ``w`` holds rows ``64 w ..``)."""
    warps = [[16 << i, 0, 0, 0] for i in range(2 + (wg - 1).bit_length())]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8], [8, 0, 0, 0]],
        lane_bases=[[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=warps, block_bases=[], shape=[64 * wg, 2, 2, 16])


BYTES_LAYOUTS = {wg: _bytes_layout(wg) for wg in (1, 2)}


@gluon.jit
def _copy_span(x_lo, x_hi, slot, x_ptr, x_off, kk, t, last):
    """Start copying span ``t``'s activations (two ``[NA, 64]`` halves) into ring slot ``slot``; a span
    from ``last`` on copies nothing. One commit group per call."""
    ok = (kk + t * 128) < last * 128
    async_copy.async_copy_global_to_shared(x_lo.index(slot), x_ptr + x_off + t * 128, mask=ok)
    async_copy.async_copy_global_to_shared(x_hi.index(slot), x_ptr + x_off + t * 128 + 64, mask=ok)
    async_copy.commit_group()


@gluon.jit
def _spans(acc, x_lo, x_hi, x_ptr, x_off, kk, first, last, spans, w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, N,
            stride0, stride1, stride2, A: gl.constexpr, STAGES: gl.constexpr, WTYPE: gl.constexpr):
    """Spans ``first .. last`` into ``acc``, each decoded after the previous span's MMAs have completed;
    the activations copied ``STAGES - 1`` spans ahead."""
    for s in gl.static_range(STAGES - 1):
        _copy_span(x_lo, x_hi, s, x_ptr, x_off, kk, first + s, last)
    words = _span_words(gl.minimum(first, spans - 1), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, N, stride0, stride1,
                        stride2, WTYPE)
    for t in range(first, last):
        i = t - first
        lo, hi = _decode(t, words, WTYPE)
        words = _span_words(gl.minimum(t + 1, last - 1), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, N, stride0,
                            stride1, stride2, WTYPE)
        async_copy.wait_group(STAGES - 2)  # span t's copy has landed (this thread's part)
        gl.thread_barrier()  # every thread's part; every warpgroup is past span t - 1's MMAs
        fence_async_shared()
        slot = i % STAGES
        acc = warpgroup_mma(_to_fragment(lo, A), x_lo.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(_to_fragment(hi, A), x_hi.index(slot).permute((1, 0)), acc, is_async=True)
        _copy_span(x_lo, x_hi, (i + STAGES - 1) % STAGES, x_ptr, x_off, kk, t + STAGES - 1, last)  # span t - 1's slot
        acc = warpgroup_mma_wait(0, deps=[acc])
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _gemm_async_kernel(x_ptr, w0_ptr, w1_ptr, w2_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride0, stride1, stride2,
                       BL: gl.constexpr, NA: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr,
                       WTYPE: gl.constexpr, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr,
                       PDL: gl.constexpr, GLU: gl.constexpr = False):
    """Grid ``(cdiv(N, 64 WG), cdiv(M, NA), SPLIT)``; ``x``: staged activations ``(cdiv(M, NA) NA, K)``;
    ``WTYPE`` 0: q4_K, 1: q6_K (as ``prefill.gemm_wgmma``); ``BL``: ``BYTES_LAYOUTS[WG]``. ``y``: ``(M,
    N)`` (+ bias, + the residual under HAS_RES), or with ``SPLIT > 1`` the partials ``(SPLIT, M, N)``; under
    GLU ``silu(g) * u`` ``(M, N / 2)``, bf16 (``prefill.gemm_wgmma.store_glu``)."""
    R: gl.constexpr = 64 * WG
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1], instr_shape=[16, NA, 16])
    A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4 * WG, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    w0 = gl.program_id(0) * R
    a0 = gl.program_id(1) * NA
    spans = K // 128
    per = gl.cdiv(spans, SPLIT)
    first = gl.minimum(gl.program_id(2) * per, spans)
    last = gl.minimum(first + per, spans)

    L3: gl.constexpr = gl.SliceLayout(3, BL)
    rb = tile_rows(w0, gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))), N, GLU)[:, None, None, None]
    sb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None, None]
    cb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :, None]
    ib = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, BL))))[None, None, None, :]
    kk = gl.arange(0, 64, layout=gl.SliceLayout(0, XL))[None, :]
    x_off = (a0 + gl.arange(0, NA, layout=gl.SliceLayout(1, XL)))[:, None] * K + kk

    x_lo = gl.allocate_shared_memory(gl.float16, [STAGES, NA, 64], XS)
    x_hi = gl.allocate_shared_memory(gl.float16, [STAGES, NA, 64], XS)
    acc = gl.zeros([R, NA], gl.float32, layout=MMA)
    enter(PDL)
    acc = _spans(acc, x_lo, x_hi, x_ptr, x_off, kk, first, last, spans, w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, ib, N,
                 stride0, stride1, stride2, A, STAGES, WTYPE)

    store_tile(acc, w0, a0, gl.program_id(2), bias_ptr, res_ptr, y_ptr, M, N, SPLIT, HAS_BIAS, HAS_RES, GLU)


#: (NA, WG, STAGES): activation rows and weight warpgroups a program, ring slots; the route's.
DEFAULT_TILE = tiles.ASYNC_TILE


def gemm_wgmma_async(a: torch.Tensor, plane, bias: torch.Tensor | None, split: int = 1, pdl: bool = False,
                     residual: torch.Tensor | None = None, tile: tuple[int, int, int] = DEFAULT_TILE,
                     out_dtype: torch.dtype = torch.float32, glu: bool = False) -> torch.Tensor:
    """``[residual +] a (M, K) @ dequant(plane).T (+ bias)`` -> ``(M, N)`` of ``out_dtype`` (float32 or
    bf16) for a q4_K or q6_K plane, any ``M``; ``a`` bf16 or float32. ``split``: split-K; ``tile``:
    ``(NA, WG, STAGES)``, see the module; ``glu``: ``silu(g) * u`` instead, as ``gemm_wgmma``'s."""
    na, wg, stages = tile
    assert na in (64, 128, 256) and wg in BYTES_LAYOUTS and stages >= 2
    m, k = a.shape
    assert a.dtype in (torch.bfloat16, torch.float32) and a.stride(1) == 1 and k % 256 == 0
    ws, wtype = plane_words(plane)
    n = ws[0].shape[0]
    y, out, b, res = glu_outputs(m, n, 64 * wg, split, bias, residual, a.device) if glu else \
        outputs(m, n, split, bias, residual, a.device, out_dtype)
    x = stage(a, triton.cdiv(m, na) * na, pdl=pdl)
    _gemm_async_kernel[(triton.cdiv(n, 64 * wg), triton.cdiv(m, na), split)](
        x, *ws, b, res, out, m, n, k, *(w.stride(0) for w in ws), BL=BYTES_LAYOUTS[wg], NA=na, WG=wg, STAGES=stages,
        WTYPE=wtype, SPLIT=split, HAS_BIAS=bias is not None, HAS_RES=residual is not None and split == 1,
        num_warps=4 * wg, GLU=glu, **launch_args(pdl))
    if split > 1:
        reduce_splits(out, bias, residual, y, pdl)
    return y
