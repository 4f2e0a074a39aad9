"""The plane family: prefill matmuls over q4_K / q6_K registration-time planes (see ``planes``).

Two designs, picked per call by the row count and the weight shape (``tiles.use_fused``):

* fused: one Triton GEMM loads nibble/scale tiles, dequantizes them in registers to bf16 and
  feeds ``tl.dot`` with fp32 accumulation; the weight is read once, nothing else is written.
* just-in-time: a Triton kernel expands the planes into a transient bf16 scratch ``(N, K)``
  (16-byte bf16 stores), then cuBLAS multiplies (``minfer_core.linalg.mm_f32``).

The just-in-time path runs near cuBLAS's rate on the big weights; the fused GEMM wins for few rows
(M <= 64, and the big weights up to one 128-row tile): narrow or K-long weights (qkv, o, down) give
few output tiles there, so it splits K (``tiles.fused_split``, from the weight's shape alone) and
the last program of a tile adds the partials in split order (``benchmarks/bench_prefill.py --small``
and ``bench_batch_gemm.py --fused [--q6]`` measure both designs).

Value decoding (shared by both): q4_K ``w = (d sc) q - (dmin m)`` with ``(sc, m)`` per 32 values
and ``(d, dmin)`` per 256; q6_K ``w = sc * ((ql | qh << 4) - 32)`` with ``sc`` per 16 values. In
float32, except the fused GEMM's q4_K tiles of ``tiles.BF16_DECODE_ROWS`` rows and more on the GPU,
which decode in bf16x2 arithmetic (:func:`_q4k_values_bf16`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as QT

from ..launch.pdl import enter, launch_args
from ..launch.split import shared_scratch
from ..q4_k.plane import Q4KPlane
from ..tiles import DEQUANT_TILES, fused_ahead, fused_bf16_decode, fused_gemm_tile, fused_split


# ---------------------------------------------------------------------------------------------
# Tile decoders (shared by the dequantize kernels and the fused GEMM)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _small_int(v, offset: tl.constexpr = 0.0):
    """An int32 ``v`` in 0 .. 2^23 - 1 as float32 ``v - offset`` (a small integer), exactly, without an
    integer-to-float conversion (a quarter-rate instruction on Hopper): ``v``'s bits under 2^23's
    exponent are the float 2^23 + v."""
    return (v | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + offset)


@triton.jit
def _q4k_scales(sc_ptr, dm_ptr, r, m3, stride_sc, stride_dm, t):
    """Span ``t``'s scales and mins of rows ``r`` ``[BN, 1, 1]``, as float32 ``[BN, 2, 1]`` (s_lo, m_lo,
    s_hi, m_hi): low nibbles ``[r, j]`` at sub-block ``4t + j``, high nibbles at ``4t + 2 + j``.

    ``sc_ptr`` / ``dm_ptr``: ``Q4KPlane.scale_words`` (``sc | m << 8`` as int16 a sub-block, ``d |
    dmin << 16`` as int32 a block), three loads a span.
    """
    j = tl.arange(0, 2)[None, :, None]
    dmw = tl.load(dm_ptr + r * stride_dm + t // 2, mask=m3, other=0)
    d = (dmw & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    dmin = (dmw >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    lo = tl.load(sc_ptr + r * stride_sc + t * 4 + j, mask=m3, other=0).to(tl.int32)
    hi = tl.load(sc_ptr + r * stride_sc + t * 4 + 2 + j, mask=m3, other=0).to(tl.int32)
    return d * _small_int(lo & 0xFF), dmin * _small_int(lo >> 8), d * _small_int(hi & 0xFF), dmin * _small_int(hi >> 8)


@triton.jit
def _q4k_nibbles(qs_ptr, r, m3, stride_qs, t, RUN: tl.constexpr = 32, WIDEN: tl.constexpr = True):
    """Span ``t``'s bytes of rows ``r`` as int32 ``[BN, 2, 32]``: element ``[r, j, l]`` holds values
    ``128t + 32j + l`` (low nibble) and ``128t + 64 + 32j + l`` (high). Offsets are built by
    multiplication so the compiler sees 64-byte aligned, contiguous rows (16-byte loads); ``RUN =
    8``: contiguous in runs of 8 bytes only, so that a thread's bytes are as many as the values of
    one 16-byte bf16 store. ``WIDEN=False``: the bytes as loaded (uint8)."""
    j = tl.arange(0, 2)[None, :, None]
    i = tl.arange(0, 32)
    l = ((i // RUN) * RUN + i % RUN)[None, None, :]
    b = tl.load(qs_ptr + r * stride_qs + t * 64 + j * 32 + l, mask=m3, other=0)
    if WIDEN:
        b = b.to(tl.int32)
    return b


@triton.jit
def _q4k_values(b, scales):
    """Nibbles ``b`` (:func:`_q4k_nibbles`) and their span's ``scales`` (:func:`_q4k_scales`) -> two
    float32 tiles ``[BN, 2, 32]`` (low, high nibbles): ``w = (d sc) q - (dmin m)``."""
    s0, m0, s1, m1 = scales
    return _small_int(b & 0xF) * s0 - m0, _small_int(b >> 4) * s1 - m1


def _q4k_bf16_ptx() -> str:
    """PTX for four bytes of q4_K nibbles (one 32-bit register, ``pack=4``) -> their low-nibble
    values ($0, $1) and high-nibble values ($2, $3) as bf16x2, ``w = q s - m`` with bf16 arithmetic:
    two bytes' nibbles are moved to the halves of a word (prmt), masked into the mantissa of 128.0
    (the bf16 128 + q, exact), 128 is subtracted (exact) and one packed fma applies the sub-block's
    scale and negated min. Each byte brings its own bf16 operands (scale and min of the low nibbles
    at $5.. and $9.., of the high ones at $13.. and $17..), which two prmt pair up for the fma: the
    four bytes of a pack need not share a row or a sub-block, whatever layout the compiler gives the
    tile (sharing byte 0's operands with byte 1 gave wrong products at (16, 128) tiles on the H200).
    Three instructions a value, against ~6 for the float32 decode with a bf16 conversion."""
    lines = ["{", ".reg .b32 t<2>, u, s, m;", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;"]
    for i in range(4):  # output word i: nibbles (low for i < 2) of bytes 2 (i % 2), 2 (i % 2) + 1
        sc, mn = 5 + 8 * (i // 2) + 2 * (i % 2), 9 + 8 * (i // 2) + 2 * (i % 2)
        if i >= 2:
            lines.append(f"shr.b32 t{i % 2}, t{i % 2}, 4;")
        lines += [f"and.b32 u, t{i % 2}, 0x000F000F;", "or.b32 u, u, $21;", "sub.rn.bf16x2 u, u, $21;",
                  f"prmt.b32 s, ${sc}, ${sc + 1}, 0x5410;", f"prmt.b32 m, ${mn}, ${mn + 1}, 0x5410;",
                  f"fma.rn.bf16x2 ${i}, u, s, m;"]
    return "\n".join(lines + ["}"])


_Q4K_BF16 = tl.constexpr(_q4k_bf16_ptx())
_Q4K_BF16_ARGS = tl.constexpr("=r,=r,=r,=r,r," + ",".join(["r"] * 20))


@triton.jit
def _bf16_pair(x):
    """float32 ``x`` rounded to bfloat16, in both halves of an int32 (a bf16x2 operand)."""
    h = x.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return h | (h << 16)


@triton.jit
def _q4k_values_bf16(b, scales, magic):
    """Bytes ``b`` (uint8 ``[BN, 2, 32]``, :func:`_q4k_nibbles` before widening) and their span's
    ``scales`` -> bf16 tiles (low, high nibbles) decoded in bf16 arithmetic (:func:`_q4k_bf16_ptx`):
    the scale and min are rounded to bf16 first, so a value can differ from :func:`_q4k_values`'s
    in its last bit or two (well inside the bf16 tolerance of the tests)."""
    s0, m0, s1, m1 = scales
    return tl.inline_asm_elementwise(
        _Q4K_BF16, _Q4K_BF16_ARGS,
        [b, tl.broadcast(_bf16_pair(s0), b)[0], tl.broadcast(_bf16_pair(-m0), b)[0],
         tl.broadcast(_bf16_pair(s1), b)[0], tl.broadcast(_bf16_pair(-m1), b)[0], tl.broadcast(magic, b)[0]],
        dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _q4k_span(qs_ptr, sc_ptr, dm_ptr, rn, mask_n, stride_qs, stride_sc, stride_dm, t, RUN: tl.constexpr = 32,
              PACKED: tl.constexpr = False, magic=0):
    """Span ``t`` (values ``128t .. 128t+127``) of rows ``rn`` as two float32 tiles ``[BN, 2, 32]``:
    tile ``h`` (0: low nibbles, 1: high nibbles) element ``[r, j, l]`` is value ``128t + 64h + 32j +
    l``, whose scale/min live at sub-block ``4t + 2h + j`` and ``d``/``dmin`` at block ``t // 2``.
    ``PACKED``: bf16 tiles from :func:`_q4k_values_bf16` (``magic``: its bf16 128.0 pair)."""
    r = rn[:, None, None]
    m3 = mask_n[:, None, None]
    b = _q4k_nibbles(qs_ptr, r, m3, stride_qs, t, RUN, WIDEN=not PACKED)
    scales = _q4k_scales(sc_ptr, dm_ptr, r, m3, stride_sc, stride_dm, t)
    if PACKED:
        w = _q4k_values_bf16(b, scales, magic)
    else:
        w = _q4k_values(b, scales)
    return w


@triton.jit
def _q6k_bytes(ptr, r, m3, stride, t, SPAN: tl.constexpr, PART: tl.constexpr):
    """Bytes ``64 PART ..`` of span ``t`` (``SPAN`` bytes a span: ``ql`` 128, ``qh`` 64) in rows ``r``
    as an int32 ``[BN, 4, 16]`` tile."""
    off = tl.arange(0, 4)[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
    return tl.load(ptr + r * stride + t * SPAN + PART * 64 + off, mask=m3, other=0).to(tl.int32)


@triton.jit
def _q6k_scale(sc_ptr, r, m3, stride_sc, t, F: tl.constexpr):
    """Run ``F``'s four scales of span ``t`` as float32 ``[BN, 4, 1]``."""
    return tl.load(sc_ptr + r * stride_sc + t * 16 + 4 * F + tl.arange(0, 4)[None, :, None], mask=m3,
                   other=0.0).to(tl.float32)


@triton.jit
def _q6k_bits(ql_ptr, qh_ptr, r, m3, stride_ql, stride_qh, t):
    """Span ``t``'s bytes of rows ``r``, each loaded once: ``ql`` of runs 0-1, of runs 2-3, and ``qh``;
    a run's decode (:func:`_q6k_values`) uses two of the three."""
    return (_q6k_bytes(ql_ptr, r, m3, stride_ql, t, 128, 0), _q6k_bytes(ql_ptr, r, m3, stride_ql, t, 128, 1),
            _q6k_bytes(qh_ptr, r, m3, stride_qh, t, 64, 0))


@triton.jit
def _q6k_scales(sc_ptr, r, m3, stride_sc, t):
    """Span ``t``'s scales of rows ``r``, run ``F``'s at ``F`` (:func:`_q6k_scale`)."""
    return (_q6k_scale(sc_ptr, r, m3, stride_sc, t, 0), _q6k_scale(sc_ptr, r, m3, stride_sc, t, 1),
            _q6k_scale(sc_ptr, r, m3, stride_sc, t, 2), _q6k_scale(sc_ptr, r, m3, stride_sc, t, 3))


@triton.jit
def _q6k_decode(lo, hi, sc, F: tl.constexpr):
    """Run ``F`` of a span as float32 ``[BN, 4, 16]`` from its ``ql`` bytes ``lo`` (those of runs
    ``2 (F // 2) ..``), its ``qh`` bytes ``hi`` and its scales ``sc`` ``[BN, 4, 1]``: element ``[r, j,
    l]`` is value ``256t + 64F + 16j + l``, its scale ``sc[16t + 4F + j]``."""
    q = ((lo >> (4 * (F % 2))) & 0xF) | (((hi >> (2 * F)) & 3) << 4)
    return _small_int(q, 32.0) * sc


@triton.jit
def _q6k_values(bits, scales, F: tl.constexpr):
    """Run ``F`` (values ``256t + 64F .. 256t + 64F + 63``) of a span (:func:`_q6k_bits`,
    :func:`_q6k_scales`) as float32 ``[BN, 4, 16]`` (see :func:`_q6k_decode`)."""
    lo01, lo23, hi = bits
    sc0, sc1, sc2, sc3 = scales
    if F < 2:
        lo = lo01
    else:
        lo = lo23
    if F == 0:
        sc = sc0
    elif F == 1:
        sc = sc1
    elif F == 2:
        sc = sc2
    else:
        sc = sc3
    return _q6k_decode(lo, hi, sc, F)


@triton.jit
def _q6k_run(ql_ptr, qh_ptr, sc_ptr, r, m3, stride_ql, stride_qh, stride_sc, t, F: tl.constexpr):
    """Run ``F`` of span ``t`` of rows ``r`` from its own loads alone: the fused GEMM's form (on the
    H200 as fast as or faster than a span's bytes loaded once, which the expansion prefers)."""
    lo = _q6k_bytes(ql_ptr, r, m3, stride_ql, t, 128, F // 2)
    hi = _q6k_bytes(qh_ptr, r, m3, stride_qh, t, 64, 0)
    return _q6k_decode(lo, hi, _q6k_scale(sc_ptr, r, m3, stride_sc, t, F), F)


# ---------------------------------------------------------------------------------------------
# Dequantize to a bf16 scratch (the just-in-time design)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _dequant_q4k_kernel(
    # pointers
    qs_ptr, sc_ptr, dm_ptr, out_ptr,
    # sizes
    N,
    # strides (elements)
    stride_qs, stride_sc, stride_dm, stride_out,
    # meta
    BLOCK_N: tl.constexpr, SPANS: tl.constexpr, PACKED: tl.constexpr,
):
    """Planes of ``N`` rows -> bf16 ``out (N, K)``; program ``(pn, pk)`` writes rows
    ``pn*BLOCK_N ..`` x values ``pk*128*SPANS .. +128*SPANS`` (SPANS even), reading two spans before
    it writes them. A thread's bytes come in runs of 8 (``RUN``), the values of one 16-byte store
    per nibble: the loads and stores share a layout, and no value goes through shared memory.
    ``PACKED``: decode in bf16x2 arithmetic (:func:`_q4k_values_bf16`)."""
    magic = tl.where(N > 0, 0x43004300, 0)  # see _gemm_planes_kernel
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    m3 = mask_n[:, None, None]
    j = tl.arange(0, 2)[None, :, None]
    i = tl.arange(0, 32)
    dst = out_ptr + rn[:, None, None] * stride_out + j * 32 + ((i // 8) * 8 + i % 8)[None, None, :]
    for s in tl.static_range(0, SPANS, 2):
        t = tl.program_id(1) * SPANS + s
        a_lo, a_hi = _q4k_span(qs_ptr, sc_ptr, dm_ptr, rn, mask_n, stride_qs, stride_sc, stride_dm, t, 8, PACKED, magic)
        b_lo, b_hi = _q4k_span(qs_ptr, sc_ptr, dm_ptr, rn, mask_n, stride_qs, stride_sc, stride_dm, t + 1, 8, PACKED,
                               magic)
        tl.store(dst + t * 128, a_lo.to(tl.bfloat16), mask=m3)
        tl.store(dst + t * 128 + 64, a_hi.to(tl.bfloat16), mask=m3)
        tl.store(dst + t * 128 + 128, b_lo.to(tl.bfloat16), mask=m3)
        tl.store(dst + t * 128 + 192, b_hi.to(tl.bfloat16), mask=m3)


@triton.jit
def _dequant_q6k_kernel(
    # pointers
    ql_ptr, qh_ptr, sc_ptr, out_ptr,
    # sizes
    N,
    # strides (elements)
    stride_ql, stride_qh, stride_sc, stride_out,
    # meta
    BLOCK_N: tl.constexpr,
):
    """Planes of ``N`` rows -> bf16 ``out (N, K)``; program ``(pn, pk)`` writes one 256-span."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    t = tl.program_id(1)
    j = tl.arange(0, 4)[None, :, None]
    l = tl.arange(0, 16)[None, None, :]
    dst = out_ptr + rn[:, None, None] * stride_out + t * 256 + j * 16 + l
    r = rn[:, None, None]
    m3 = mask_n[:, None, None]
    bits = _q6k_bits(ql_ptr, qh_ptr, r, m3, stride_ql, stride_qh, t)
    scales = _q6k_scales(sc_ptr, r, m3, stride_sc, t)
    for f in tl.static_range(4):
        tl.store(dst + 64 * f, _q6k_values(bits, scales, f).to(tl.bfloat16), mask=m3)


def dequant_plane(plane, k: int, out: torch.Tensor, r0: int = 0, r1: int | None = None,
                  config: tuple[int, int, int] | None = None, packed: bool | None = None) -> torch.Tensor:
    """Rows ``r0:r1`` of a plane -> ``out`` bf16 ``(r1 - r0, K)`` (contiguous rows); ``packed`` (q4_K,
    GPU): decode in bf16x2 arithmetic (no faster here, so not by default; ``tiles.BF16_DECODE_ROWS``)."""
    r1 = plane_rows(plane) if r1 is None else r1
    n = r1 - r0
    assert out.dtype == torch.bfloat16 and out.shape == (n, k) and out.stride(1) == 1 and k % 256 == 0
    if isinstance(plane, Q4KPlane):
        bn, spans, warps = config or DEQUANT_TILES["q4_k"]
        if k % (128 * spans):
            spans = 2  # K is a whole number of 256-value blocks
        sc, dm = plane.scale_words()
        qs, sc, dm = plane.qs[r0:r1], sc[r0:r1], dm[r0:r1]
        grid = (triton.cdiv(n, bn), k // (128 * spans))
        _dequant_q4k_kernel[grid](qs, sc, dm, out, n, qs.stride(0), sc.stride(0), dm.stride(0), out.stride(0),
                                  BLOCK_N=bn, SPANS=spans, num_warps=warps,
                                  PACKED=out.is_cuda and bool(packed))
    else:
        bn, _, warps = config or DEQUANT_TILES["q6_k"]
        ql, qh, sc = plane.ql[r0:r1], plane.qh[r0:r1], plane.sc[r0:r1]
        grid = (triton.cdiv(n, bn), k // 256)
        _dequant_q6k_kernel[grid](ql, qh, sc, out, n, ql.stride(0), qh.stride(0), sc.stride(0),
                                  out.stride(0), BLOCK_N=bn, num_warps=warps)
    return out


def plane_rows(plane) -> int:
    return (plane.qs if isinstance(plane, Q4KPlane) else plane.ql).shape[0]


# ---------------------------------------------------------------------------------------------
# Fused GEMM (dequantize in registers, bf16 tensor cores)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _mma(acc, a, w, DOT_F32: tl.constexpr, SWAP: tl.constexpr = False):
    """``acc += a @ w.T`` for a bf16 ``[BM, 64]`` and a float32 weight tile ``[BN, 64]``; ``SWAP``:
    ``acc.T += w @ a.T`` (``acc`` is ``[BN, BM]``: the weight tile is the MMA's A operand, the rows
    its N).

    ``DOT_F32`` (CPU interpreter only, whose bf16 dot is unusable) multiplies in float32.
    """
    if SWAP:
        if DOT_F32:
            out = tl.dot(w.to(tl.float32), tl.trans(a.to(tl.float32)), acc, input_precision="ieee")
        else:
            out = tl.dot(w.to(tl.bfloat16), tl.trans(a), acc)
    elif DOT_F32:
        out = tl.dot(a.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
    else:
        out = tl.dot(a, tl.trans(w.to(tl.bfloat16)), acc)
    return out


@triton.jit
def _gemm_planes_kernel(
    # pointers: activation bf16 (M, K); plane tensors p0/p1/p2 (q4_K: qs, sc, dm; q6_K: ql, qh, sc);
    # bias f32 (N,) or dummy; output f32 (M, N)
    a_ptr, p0_ptr, p1_ptr, p2_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
    # sizes
    M, N, K,
    # strides (elements)
    stride_am, stride_p0, stride_p1, stride_p2, stride_cm,
    # meta
    WTYPE: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr,
    AHEAD: tl.constexpr, PACKED: tl.constexpr, SWAP: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """``c = a @ W.T (+ bias)`` with W decoded from its plane; WTYPE 0 = q4_K, 1 = q6_K.

    Each K step covers one span (128 values for q4_K, 256 for q6_K) as 64-wide dots; AHEAD (q4_K):
    a step loads the next span's scales before decoding its own, so that their latency hides
    behind a step of arithmetic (the same bits either way). Grid
    (output tiles, SPLIT): split ``s`` sums its share of the spans; with SPLIT > 1 the partial
    tiles meet in ``part`` and the program that arrives last adds them in the order s = 0, 1, ...
    (the same bits whichever finished last; see ``launch.split``). PACKED (q4_K, GPU only): decode
    in bf16x2 arithmetic (:func:`_q4k_values_bf16`) rather than float32. PDL: launched with
    programmatic dependent launch (``launch.pdl``).
    """
    enter(PDL)
    pid = tl.program_id(0)
    s_id = tl.program_id(1)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * grid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    rk = tl.arange(0, 64)
    a_row = a_ptr + rm[:, None] * stride_am + rk[None, :]
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    spans = K // 128 if WTYPE == 0 else K // 256
    per = tl.cdiv(spans, SPLIT)
    lo = s_id * per
    hi = tl.minimum(lo + per, spans)
    r3 = rn[:, None, None]
    m3 = mask_n[:, None, None]
    if WTYPE == 0:
        if AHEAD:  # a split past the end loads the last span, which it does not use
            nxt = _q4k_scales(p1_ptr, p2_ptr, r3, m3, stride_p1, stride_p2, tl.minimum(lo, spans - 1))
        if PACKED:  # bf16 128.0 twice, in a register the compiler keeps (it cannot fold K)
            magic = tl.where(K > 0, 0x43004300, 0)
        for t in range(lo, hi):
            b = _q4k_nibbles(p0_ptr, r3, m3, stride_p0, t, WIDEN=not PACKED)
            if AHEAD:
                scales = nxt
                nxt = _q4k_scales(p1_ptr, p2_ptr, r3, m3, stride_p1, stride_p2, tl.minimum(t + 1, hi - 1))
            else:
                scales = _q4k_scales(p1_ptr, p2_ptr, r3, m3, stride_p1, stride_p2, t)
            if PACKED:
                w_lo, w_hi = _q4k_values_bf16(b, scales, magic)
            else:
                w_lo, w_hi = _q4k_values(b, scales)
            a0 = tl.load(a_row + t * 128, mask=mask_m[:, None], other=0.0)
            a1 = tl.load(a_row + t * 128 + 64, mask=mask_m[:, None], other=0.0)
            acc = _mma(acc, a0, tl.reshape(w_lo, (BLOCK_N, 64)), DOT_F32, SWAP)
            acc = _mma(acc, a1, tl.reshape(w_hi, (BLOCK_N, 64)), DOT_F32, SWAP)
    else:
        for t in range(lo, hi):
            for f in tl.static_range(4):
                w = _q6k_run(p0_ptr, p1_ptr, p2_ptr, r3, m3, stride_p0, stride_p1, stride_p2, t, f)
                a = tl.load(a_row + t * 256 + 64 * f, mask=mask_m[:, None], other=0.0)
                acc = _mma(acc, a, tl.reshape(w, (BLOCK_N, 64)), DOT_F32, SWAP)
    if SWAP:
        acc = tl.trans(acc)
    mask = mask_m[:, None] & mask_n[None, :]
    c = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=mask_n, other=0.0)[None, :]
        tl.store(c, acc, mask=mask)
    else:
        part = part_ptr + rm[:, None] * N + rn[None, :]
        tl.store(part + s_id * M * N, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tot = tl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
            for r in tl.static_range(1, SPLIT):
                tot += tl.load(part + r * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(bias_ptr + rn, mask=mask_n, other=0.0)[None, :]
            tl.store(c, tot, mask=mask)
            tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")


def _fit_stages(bm: int, bn: int, span: int, stages: int, budget: int = 200 * 1024) -> int:
    """Pipeline depth whose shared memory fits: ``stages`` activation tiles (bf16 ``BM x span``)
    plus the dequantized weight tile (bf16 ``BN x span``)."""
    while stages > 1 and stages * bm * span * 2 + bn * span * 2 > budget:
        stages -= 1
    return stages


def gemm_fused(a: torch.Tensor, plane, bias: torch.Tensor | None, config=None,
               ahead: bool | None = None, packed: bool | None = None, swap: bool | None = None,
               pdl: bool = False) -> torch.Tensor:
    """``a`` bf16 ``(M, K)`` @ dequant(plane).T (+ bias) -> float32 ``(M, N)``.

    ``config``: ``(BLOCK_M, BLOCK_N, num_warps, num_stages[, SPLIT])``; by default the row
    bucket's tile for the plane's type and height (``tiles.fused_gemm_tile``, with its ``swap``) and the split
    ``tiles.fused_split`` picks from the weight's shape alone, so a row's result never depends on
    how many rows came with it. ``ahead`` (q4_K): load each span's scales a step early (default
    ``tiles.fused_ahead``); it changes no bit of the result. ``packed`` (q4_K on the GPU): decode in
    bf16x2 arithmetic (default ``tiles.fused_bf16_decode`` on unswapped tiles; the CPU interpreter
    always decodes in float32).
    ``swap``: the weight tile as the MMA's A operand and the rows as its N (compiled for sm_90 this
    puts 16- and 32-row tiles on wgmma, ``sass_loop.py --fused --swap``); by default the tile's, and
    off for a given ``config``. Neither ``swap`` nor the split depends on how many rows share a tile.
    ``pdl``: launch with programmatic dependent launch (``launch.pdl``).
    """
    m, k = a.shape
    assert a.dtype == torch.bfloat16 and a.stride(1) == 1 and k % 256 == 0
    if isinstance(plane, Q4KPlane):
        (p1, p2), p0, wtype = plane.scale_words(), plane.qs, 0
    else:
        p0, p1, p2, wtype = plane.ql, plane.qh, plane.sc, 1
    n = p0.shape[0]
    span = 128 if wtype == 0 else 256
    c = torch.empty(m, n, dtype=torch.float32, device=a.device)
    if config is None:
        *config, tile_swap = fused_gemm_tile(m, QT.Q6_K if wtype else QT.Q4_K, n)
        swap = tile_swap if swap is None else swap
    swap = bool(swap)
    bm, bn, warps, stages, *rest = config
    split = rest[0] if rest else fused_split(n, k // span, bn)
    stages = _fit_stages(bm, bn, span, stages)
    ahead = wtype == 0 and (fused_ahead(bm) if ahead is None else ahead)
    # swapped tiles decode in float32 by default: gate|up's 32-row tile in bf16x2 moved a 32-sequence
    # engine's logits 0.079 (relative) from the single stream's, too far for the GPU test
    # test_gpu_batched_equals_single_stream_engine (with PDL on or off alike)
    packed = wtype == 0 and a.is_cuda and (fused_bf16_decode(bm) and not swap if packed is None else packed)
    tiles_mn = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if split > 1:
        part, cnt = shared_scratch("part", split * m * n, a.device), shared_scratch("cnt", tiles_mn, a.device)
    else:
        part, cnt = c, c
    _gemm_planes_kernel[(tiles_mn, split)](
        a, p0, p1, p2, bias if bias is not None else c, c, part, cnt,
        m, n, k,
        a.stride(0), p0.stride(0), p1.stride(0), p2.stride(0), c.stride(0),
        WTYPE=wtype, HAS_BIAS=bias is not None, DOT_F32=not a.is_cuda,
        BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, SPLIT=split, AHEAD=ahead, PACKED=packed, SWAP=swap,
        num_warps=warps, num_stages=stages, **launch_args(pdl),
    )
    return c
