"""q4_K / q6_K GEMMs of hundreds of rows on Hopper's warpgroup MMA, warp-specialized: decode warps write
the weights to shared memory while the MMA warps multiply (``tiles.ws_route`` says where it serves).

``prefill.gemm_wgmma_async`` decodes the weights into the MMA's A registers, so the warps that decode
are the warps that wait on the tensor cores, and the decode adds to the MMAs instead of overlapping
them. Here the two are different warps of one program:

- The *decode partition* (``P`` warps) loads a 128-value span of ``64 WG`` weight rows as int32 words
  (two spans ahead, each requested before the stores of the span three before it), decodes it in f16x2
  arithmetic into its low- and high-nibble halves (64 values a row each: byte ``p`` of a span holds
  values ``p`` and ``64 + p``), and stores each half into a ring slot of shared memory once the slot
  is free, after asking the TMA for the half's ``NA`` activation rows (float16) into the same slot.
  q4_K masks a nibble pair straight into the mantissas of 1024.0, which puts each word's values in the
  order 0, 2, 1, 3; the staged activations follow it (``stage(perm=2)``). q6_K keeps
  ``prefill.gemm_wgmma``'s decode and K's own order.
- The *MMA partition* (``WG`` warpgroups, 64 weight rows each) waits for a slot, orders the decode
  warps' stores before its own reads (the proxy fence: in the decode warps it compiles to a
  ``MEMBAR.ALL.CTA`` that waits for their loads of the spans ahead: 3-6% of a call), issues its ``wgmma``
  (both operands from shared memory, K = 64) asynchronously, hands the previous slot back once its MMA
  has completed, and at the end of a tile stores it (``prefill.gemm_wgmma.store_tile``, so split-K
  partials and the residual work as in the other GEMMs) while the decode partition fills the ring for
  the next.

Each slot has two barriers: *ready* (the decode's arrival and the TMA's bytes) and *empty* (the MMA
partition's arrival). A program (at most one a multiprocessor) walks tiles of ``NA`` activation rows
x ``64 WG`` weight rows x a split, activation tiles fastest, so that programs running together share
weight rows. A row's bits do not depend on the other rows of the call (one column of the MMA, K in a
fixed order). Gluon, CUDA only (compute capability 9.0).

Where its time goes (H100, ``benchmarks/README.md``): with the MMAs taken out a call takes about as
long as the whole, so the decode partition is the bound; 8 decode warps beside one MMA warpgroup
(the default tile) beat 4 beside two at 256-512 rows.
"""

from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .. import tiles
from ..launch.device import sm_count
from ..launch.pdl import enter, launch_args
from ..launch.rows import reduce_splits
from .gemm_wgmma import _q4k_scales, _q6k_ptx, glu_outputs, outputs, plane_words, stage, store_tile, tile_rows


@functools.cache  # built once: a launch passes it as a constexpr, and building one takes ~20 us of host time
def _decode_layout(rows: int, warps: int) -> gl.DistributedLinearLayout:
    """A span's bytes of ``rows`` weight rows as int32 words ``(row, s, c0, w)`` (bytes ``32 s + 16 c0 +
    4 w ..``) over ``warps`` warps: 4 contiguous words a thread and row (registers), the four 16-byte
    runs of a row and 8 rows across a warp's lanes, then rows across warps, the remaining rows in
    registers."""
    lanes = [[0, 0, 1, 0], [0, 1, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]]
    wbits = (warps - 1).bit_length()
    rbits = (rows - 1).bit_length()
    warp_bases = [[8 << i, 0, 0, 0] for i in range(wbits)]
    extra = [[8 << i, 0, 0, 0] for i in range(wbits, rbits - 3)]
    return gl.DistributedLinearLayout(reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2]] + extra, lane_bases=lanes,
                                      warp_bases=warp_bases, block_bases=[], shape=[rows, 2, 2, 4])


#: the staged activations' ring slots (the TMA's destination, the MMA's B operand)
_X_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

# q6_K: the f16x2 decode of ``prefill.gemm_wgmma`` on one word a call (pack=1: each operand once)
_Q6K = gl.constexpr(_q6k_ptx(("$6", "$7"), "$8"))
_ARGS = gl.constexpr("=r,=r,=r,=r,r,r,r,r,r")


def _q4k_crossed_ptx() -> str:
    """One q4_K word (``$4``) -> f16x2 ``q s - m`` of its low nibbles as bytes (0, 2) (``$0``) and (1, 3)
    (``$1``), and of its high nibbles likewise (``$2``, ``$3``); ``$5`` / ``$6`` the low nibbles' scale
    and negated min, ``$7`` / ``$8`` the high nibbles'. A nibble pair is masked straight into the
    mantissas of 1024.0 (one ``lop3``), so the values land in the order 0, 2, 1, 3 of each word, which
    the staged activations follow (``stage(perm=2)``)."""
    lines = ["{", ".reg .b32 u, v, mg;", "mov.b32 mg, 0x64006400;"]
    for i, shift in enumerate((0, 8, 4, 12)):
        src = "$4"
        if shift:
            lines.append(f"shr.b32 v, $4, {shift};")
            src = "v"
        s, m = ("$5", "$6") if i < 2 else ("$7", "$8")
        lines += [f"lop3.b32 u, {src}, 0x000F000F, mg, 0xEA;", "sub.rn.f16x2 u, u, mg;",
                  f"fma.rn.f16x2 ${i}, u, {s}, {m};"]
    return "\n".join(lines + ["}"])


_Q4K_CROSSED = gl.constexpr(_q4k_crossed_ptx())


@gluon.jit
def _n_tiles(M, N, NA: gl.constexpr, R: gl.constexpr, SPLIT: gl.constexpr):
    """Tiles of a call: activation tiles x weight tiles x splits."""
    return gl.cdiv(M, NA) * gl.cdiv(N, R) * SPLIT


@gluon.jit
def _tile(i, M, N, K, NA: gl.constexpr, R: gl.constexpr, SPLIT: gl.constexpr):
    """Tile ``i`` -> its first activation row, first weight row, split, and spans ``first .. last``;
    activation tiles vary fastest, then weight tiles, then splits."""
    n_a = gl.cdiv(M, NA)
    n_w = gl.cdiv(N, R)
    part = i // (n_a * n_w)
    spans = K // 128
    per = gl.cdiv(spans, SPLIT)
    first = gl.minimum(part * per, spans)
    return (i % n_a) * NA, ((i // n_a) % n_w) * R, part, first, gl.minimum(first + per, spans)


@gluon.jit
def _words(t, w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, wb, n_rows, stride0, stride1, stride2, WTYPE: gl.constexpr):
    """Span ``t`` of rows ``rb`` as loaded: q4_K its words ``[R, 2, 2, 4]``, its block's ``d | dmin``
    word and the low and high nibbles' ``sc | m << 8`` words (``[R, 2, 1, 1]``); q6_K its ``ql`` and
    ``qh`` words and the low and high nibbles' float16 scales (``[R, 2, 2, 1]``)."""
    ok = rb < n_rows
    p = sb * 8 + cb * 4 + wb  # word of the span's 64 bytes
    q0 = w0_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    if WTYPE == 0:
        return (gl.load(q0 + rb * (stride0 // 4) + t * 16 + p, mask=ok, other=0),
                gl.load(w2_ptr + rb * stride2 + t // 2, mask=ok, other=0),
                gl.load(w1_ptr + rb * stride1 + t * 4 + sb, mask=ok, other=0).to(gl.int32),
                gl.load(w1_ptr + rb * stride1 + t * 4 + 2 + sb, mask=ok, other=0).to(gl.int32))
    else:
        q1 = w1_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
        sub = (t // 2) * 16 + (t % 2) * 8 + 2 * sb + cb  # 16-value sub-block of the low nibbles
        return (gl.load(q0 + rb * (stride0 // 4) + t * 16 + p, mask=ok, other=0),
                gl.load(q1 + rb * (stride1 // 4) + (t // 2) * 16 + p, mask=ok, other=0),
                gl.load(w2_ptr + rb * stride2 + sub, mask=ok, other=0).to(gl.int32) & 0xFFFF,
                gl.load(w2_ptr + rb * stride2 + sub + 4, mask=ok, other=0).to(gl.int32) & 0xFFFF)


@gluon.jit
def _decode_words(t, words, WTYPE: gl.constexpr):
    """Span ``t``'s words (:func:`_words`) -> its low- and high-nibble halves, each ``[R, 32]`` int32
    f16x2 pairs, word ``i`` of a half holding its values ``2 i``, ``2 i + 1`` (q6_K) or, q4_K, the
    crossed order of :func:`_q4k_crossed_ptx` (values ``4 w, 4 w + 2`` then ``4 w + 1, 4 w + 3``)."""
    if WTYPE == 0:
        w, dmw, lo, hi = words
        l0, l1, h0, h1 = gl.inline_asm_elementwise(_Q4K_CROSSED, _ARGS, [w] + _q4k_scales(dmw, lo, hi, w),
                                                   dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    else:
        ql, qh, s0, s1 = words
        shift = gl.full(ql.shape, 4, gl.int32, ql.type.layout) * (t % 2)
        l0, l1, h0, h1 = gl.inline_asm_elementwise(
            _Q6K, _ARGS, [ql, qh, gl.broadcast(s0 | (s0 << 16), ql)[0], gl.broadcast(s1 | (s1 << 16), ql)[0], shift],
            dtype=(gl.int32,) * 4, is_pure=True, pack=1)
    R: gl.constexpr = l0.shape[0]
    return gl.reshape(gl.join(l0, l1), [R, 32]), gl.reshape(gl.join(h0, h1), [R, 32])


@gluon.jit
def _decode_partition(x_desc, w_smem, x_smem, ready, empty, w0_ptr, w1_ptr, w2_ptr, M, N, K, stride0, stride1,
                      stride2, DL: gl.constexpr, WTYPE: gl.constexpr, SPLIT: gl.constexpr, GLU: gl.constexpr):
    """For each tile and half span: wait for its ring slot, start the TMA of its activations, store its
    decoded half (decoded while waiting) and hand the slot over; after each span, decode the next, whose
    words were loaded two spans ahead."""
    R: gl.constexpr = w_smem.shape[1]
    S: gl.constexpr = w_smem.shape[0]
    NA: gl.constexpr = x_desc.block_type.shape[0]
    W32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    L3: gl.constexpr = gl.SliceLayout(3, DL)
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    sb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None, None]
    cb = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :, None]
    wb = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, DL))))[None, None, None, :]

    c = 0  # half spans handed to the ring so far
    for i in range(gl.program_id(0), _n_tiles(M, N, NA, R, SPLIT), gl.num_programs(0)):
        a0, w0, part, first, last = _tile(i, M, N, K, NA, R, SPLIT)
        rb = tile_rows(w0, rows, N, GLU)[:, None, None, None]
        top = gl.maximum(last - 1, 0)
        lo, hi = _decode_words(first, _words(gl.minimum(first, top), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, wb, N,
                                             stride0, stride1, stride2, WTYPE), WTYPE)
        near = _words(gl.minimum(first + 1, top), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, wb, N, stride0, stride1,
                      stride2, WTYPE)
        far = _words(gl.minimum(first + 2, top), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, wb, N, stride0, stride1,
                     stride2, WTYPE)
        for t in range(first, last):
            # the words three spans ahead, requested before this span's stores: loaded at the loop's end,
            # the compiler's copies into ``far`` at the next iteration's start would wait for them
            ahead = _words(gl.minimum(t + 3, top), w0_ptr, w1_ptr, w2_ptr, rb, sb, cb, wb, N, stride0, stride1,
                           stride2, WTYPE)
            for h in gl.static_range(2):
                s = c % S
                mbarrier.wait(empty.index(s), ((c // S) & 1) ^ 1)
                mbarrier.expect(ready.index(s), x_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(x_desc, [a0, t * 128 + 64 * h], ready.index(s), x_smem.index(s))
                w_smem.index(s)._reinterpret(gl.int32, [R, 32], W32).store(lo if h == 0 else hi)
                gl.thread_barrier()  # every decode warp's stores are in shared memory (the MMA warps fence)
                mbarrier.arrive(ready.index(s))
                c += 1
            lo, hi = _decode_words(t + 1, near, WTYPE)
            near = far
            far = ahead


@gluon.jit
def _mma_partition(w_smem, x_smem, ready, empty, bias_ptr, res_ptr, y_ptr, M, N, K, MMA: gl.constexpr,
                   SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr, GLU: gl.constexpr):
    """For each tile: multiply each ready slot into the accumulator, hand a slot back once its MMA has
    completed, and store the tile (while the decode partition fills the ring for the next)."""
    R: gl.constexpr = w_smem.shape[1]
    S: gl.constexpr = w_smem.shape[0]
    NA: gl.constexpr = x_smem.shape[1]
    c = 0  # half spans taken from the ring so far
    for i in range(gl.program_id(0), _n_tiles(M, N, NA, R, SPLIT), gl.num_programs(0)):
        a0, w0, part, first, last = _tile(i, M, N, K, NA, R, SPLIT)
        acc = gl.zeros([R, NA], gl.float32, layout=MMA)
        halves = 2 * (last - first)
        for j in range(halves):
            s = c % S
            mbarrier.wait(ready.index(s), (c // S) & 1)
            fence_async_shared()  # the decode warps' stores, acquired through the barrier, before the MMA reads them
            acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])  # the MMA of the previous slot has completed
            gl.thread_barrier()  # in every warpgroup
            mbarrier.arrive(empty.index((c + S - 1) % S), pred=j > 0)
            c += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(empty.index((c + S - 1) % S), pred=halves > 0)
        store_tile(acc, w0, a0, part, bias_ptr, res_ptr, y_ptr, M, N, SPLIT, HAS_BIAS, HAS_RES, GLU)


@gluon.jit
def _gemm_ws_kernel(x_desc, w0_ptr, w1_ptr, w2_ptr, bias_ptr, res_ptr, y_ptr, M, N, K, stride0, stride1, stride2,
                    DL: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr, P: gl.constexpr, REGS: gl.constexpr,
                    WTYPE: gl.constexpr, SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_RES: gl.constexpr,
                    PDL: gl.constexpr, GLU: gl.constexpr = False):
    """Any grid: each program walks tiles ``program_id, + num_programs, ..`` of ``cdiv(M, NA) cdiv(N, 64
    WG) SPLIT``. ``x_desc``: the staged activations ``(cdiv(M, NA) NA, K)`` in ``[NA, 64]`` blocks;
    ``DL``: ``_decode_layout(64 WG, P)``; ``WTYPE`` 0: q4_K, 1: q6_K (as ``prefill.gemm_wgmma``). ``y``:
    ``(M, N)`` (+ bias, + the residual under HAS_RES), or with ``SPLIT > 1`` the partials ``(SPLIT, M,
    N)``; under GLU ``silu(g) * u`` ``(M, N / 2)``, bf16 (``prefill.gemm_wgmma.store_glu``)."""
    R: gl.constexpr = 64 * WG
    NA: gl.constexpr = x_desc.block_type.shape[0]
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1], instr_shape=[16, NA, 16])
    WS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    w_smem = gl.allocate_shared_memory(gl.float16, [STAGES, R, 64], WS)
    x_smem = gl.allocate_shared_memory(gl.float16, [STAGES, NA, 64], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=2)  # the TMA's expect and the decode's arrival
        mbarrier.init(empty.index(i), count=1)
    enter(PDL)
    gl.warp_specialize([
        (_mma_partition, (w_smem, x_smem, ready, empty, bias_ptr, res_ptr, y_ptr, M, N, K, MMA, SPLIT, HAS_BIAS,
                          HAS_RES, GLU)),
        (_decode_partition, (x_desc, w_smem, x_smem, ready, empty, w0_ptr, w1_ptr, w2_ptr, M, N, K, stride0, stride1,
                             stride2, DL, WTYPE, SPLIT, GLU)),
    ], [P], [REGS])


#: (NA, WG, STAGES, P, REGS): activation rows a tile, MMA warpgroups (64 weight rows each), ring slots
#: (half spans), decode warps and their registers a thread; the route's.
DEFAULT_TILE = tiles.WS_TILE


def max_regs(wg: int, p: int) -> int:
    """Registers a thread such that one program of ``4 wg + p`` warps fills a multiprocessor's 64K (the
    MMA partition gets what the decode partition's ``REGS`` leave)."""
    return 65536 // (32 * (4 * wg + p)) // 8 * 8


def gemm_wgmma_ws(a: torch.Tensor, plane, bias: torch.Tensor | None, split: int = 1, pdl: bool = False,
                  residual: torch.Tensor | None = None, tile: tuple[int, int, int, int, int] = DEFAULT_TILE,
                  out_dtype: torch.dtype = torch.float32, glu: bool = False) -> torch.Tensor:
    """``[residual +] a (M, K) @ dequant(plane).T (+ bias)`` -> ``(M, N)`` of ``out_dtype`` (float32 or
    bf16) for a q4_K or q6_K plane, any ``M``; ``a`` bf16 or float32. ``split``: split-K; ``tile``: see
    ``DEFAULT_TILE``; ``glu``: ``silu(g) * u`` instead, as ``prefill.gemm_wgmma.gemm_wgmma``'s."""
    na, wg, stages, p, regs = tile
    assert na in (64, 128, 256) and wg in (1, 2) and stages >= 2 and p in (4, 8) and 4 * wg + p <= 16
    m, k = a.shape
    assert a.dtype in (torch.bfloat16, torch.float32) and a.stride(1) == 1 and k % 256 == 0
    ws, wtype = plane_words(plane)
    n = ws[0].shape[0]
    y, out, b, res = glu_outputs(m, n, 64 * wg, split, bias, residual, a.device) if glu else \
        outputs(m, n, split, bias, residual, a.device, out_dtype)
    x = stage(a, triton.cdiv(m, na) * na, pdl=pdl, perm=2 if wtype == 0 else 0)  # _decode_words' K order
    x_desc = TensorDescriptor.from_tensor(x, [na, 64], _X_LAYOUT)
    n_tiles = triton.cdiv(m, na) * triton.cdiv(n, 64 * wg) * split
    _gemm_ws_kernel[(min(n_tiles, sm_count(a.device)),)](
        x_desc, *ws, b, res, out, m, n, k, *(w.stride(0) for w in ws), DL=_decode_layout(64 * wg, p), WG=wg,
        STAGES=stages, P=p, REGS=regs, WTYPE=wtype, SPLIT=split, HAS_BIAS=bias is not None,
        HAS_RES=residual is not None and split == 1, num_warps=4 * wg, maxnreg=max_regs(wg, p), GLU=glu,
        **launch_args(pdl))
    if split > 1:
        reduce_splits(out, bias, residual, y, pdl)
    return y
