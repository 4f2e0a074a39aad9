"""The generic family: prefill matmuls straight from raw GGUF blocks.

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-value blocks) and Q4_K, Q5_K, Q6_K (256-value blocks;
q4_K/q6_K land here when the plane family is switched off). Design: just-in-time dequantization
of the weight into a transient bf16 scratch by one Triton kernel, then cuBLAS
(``launch.scratch.jit_matmul``). The kernel works on a ``[BLOCK_N, 256]`` value tile and gathers each
value's bits and scales from its block with byte loads (the blocks are not 16-byte aligned);
repeated scale loads hit L1. Arithmetic follows ggml's order: scale products first, in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import BLOCK_FIELDS, info

# type id (constexpr) per quant type
_TID = {QT.Q4_0: 0, QT.Q4_1: 1, QT.Q5_0: 2, QT.Q5_1: 3, QT.Q8_0: 4, QT.Q4_K: 5, QT.Q5_K: 6, QT.Q6_K: 7}



@triton.jit
def _u8(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _f16(ptr, mask):
    """The little-endian float16 at byte ``ptr`` as float32."""
    v = _u8(ptr, mask) | (_u8(ptr + 1, mask) << 8)
    return v.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k4_scale_min(sp, j, mask):
    """q4_K/Q5_K 6-bit scale and min of sub-block ``j`` (0..7) from the 12 bytes at ``sp``."""
    lo = j < 4
    jj = tl.where(lo, j, j - 4)
    a = _u8(sp + jj, mask)        # j<4: scale byte      j>=4: high bits of scale (>>6)
    b = _u8(sp + jj + 4, mask)    # j<4: min byte        j>=4: high bits of min (>>6)
    c = _u8(sp + jj + 8, mask)    # j>=4: low nibbles of scale | min
    sc = tl.where(lo, a & 63, (c & 0xF) | ((a >> 6) << 4))
    mn = tl.where(lo, b & 63, (c >> 4) | ((b >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _dequant_raw_kernel(
    # pointers
    raw_ptr, out_ptr, idx_ptr,
    # sizes
    N, K, NSRC,
    # strides (elements)
    stride_raw, stride_out,
    # meta
    TID: tl.constexpr, TYPE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    # byte offsets in a block (``minfer_core.quants.BLOCK_FIELDS``; 0 where the type has no such field)
    D: tl.constexpr, M: tl.constexpr, SC: tl.constexpr, QH: tl.constexpr, QS: tl.constexpr,
    GATHER: tl.constexpr = False, OUT_F32: tl.constexpr = False,
):
    """Raw blocks ``(N, row_bytes)`` uint8 -> bf16 ``out (N, K)``; program ``(pn, pk)`` writes
    rows ``pn*BLOCK_N ..`` x values ``pk*256 .. pk*256+255``. ``M``: the min (``m`` or ``dmin``),
    ``QS``: the low bits (``qs`` or ``ql``). GATHER: output row ``i`` is raw row ``idx[i]`` (clamped to
    the ``NSRC`` raw rows: an id out of range never reads outside the table); OUT_F32: float32 output."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    v = tl.program_id(1) * 256 + tl.arange(0, 256)
    mask = (rn[:, None] < N) & (v[None, :] < K)
    src = tl.minimum(tl.maximum(tl.load(idx_ptr + rn, mask=rn < N, other=0), 0), NSRC - 1) if GATHER else rn
    row = raw_ptr + src.to(tl.int64)[:, None] * stride_raw
    if TID <= 4:  # 32-value blocks
        base = row + (v // 32)[None, :] * TYPE_SIZE
        pos = (v % 32)[None, :]
        d = _f16(base + D, mask)
        if TID == 0:  # Q4_0: d | qs[16]
            q = (_u8(base + QS + pos % 16, mask) >> (4 * (pos // 16))) & 0xF
            w = d * (q - 8).to(tl.float32)
        elif TID == 1:  # Q4_1: d | m | qs[16]
            q = (_u8(base + QS + pos % 16, mask) >> (4 * (pos // 16))) & 0xF
            w = d * q.to(tl.float32) + _f16(base + M, mask)
        elif TID == 2:  # Q5_0: d | qh[4] | qs[16]
            q = (_u8(base + QS + pos % 16, mask) >> (4 * (pos // 16))) & 0xF
            q = q | (((_u8(base + QH + pos // 8, mask) >> (pos % 8)) & 1) << 4)
            w = d * (q - 16).to(tl.float32)
        elif TID == 3:  # Q5_1: d | m | qh[4] | qs[16]
            q = (_u8(base + QS + pos % 16, mask) >> (4 * (pos // 16))) & 0xF
            q = q | (((_u8(base + QH + pos // 8, mask) >> (pos % 8)) & 1) << 4)
            w = d * q.to(tl.float32) + _f16(base + M, mask)
        else:  # Q8_0: d | qs int8[32]
            q = tl.load(base + QS + pos, mask=mask, other=0).to(tl.int8, bitcast=True)
            w = d * q.to(tl.float32)
    else:  # 256-value super-blocks
        base = row + (v // 256)[None, :] * TYPE_SIZE
        pos = (v % 256)[None, :]
        if TID == 7:  # Q6_K: ql[128] | qh[64] | scales int8[16] | d
            h = pos // 128
            r = pos % 128
            ql = (_u8(base + QS + 64 * h + r % 64, mask) >> (4 * (r // 64))) & 0xF
            qh = (_u8(base + QH + 32 * h + r % 32, mask) >> (2 * (r // 32))) & 3
            sc = tl.load(base + SC + pos // 16, mask=mask, other=0).to(tl.int8, bitcast=True)
            w = (_f16(base + D, mask) * sc.to(tl.float32)) * ((ql | (qh << 4)) - 32).to(tl.float32)
        else:  # Q4_K: d | dmin | scales[12] | qs[128];  Q5_K: ... | qh[32] | qs[128]
            sub = pos // 32
            sc, mn = _k4_scale_min(base + SC, sub, mask)
            q = (_u8(base + QS + 32 * (pos // 64) + pos % 32, mask) >> (4 * (sub % 2))) & 0xF
            if TID == 6:
                q = q | (((_u8(base + QH + pos % 32, mask) >> sub) & 1) << 4)
            w = (_f16(base + D, mask) * sc) * q.to(tl.float32) - _f16(base + M, mask) * mn
    dst = out_ptr + rn[:, None] * stride_out + v[None, :]
    tl.store(dst, w if OUT_F32 else w.to(tl.bfloat16), mask=mask)


def _offsets(qt) -> dict:
    """The kernel's byte-offset constexprs for ``qt`` (see ``_dequant_raw_kernel``)."""
    f = BLOCK_FIELDS[qt]
    at = lambda *names: next((f[n][0] for n in names if n in f), 0)  # noqa: E731
    return dict(D=at("d"), M=at("m", "dmin"), SC=at("scales"), QH=at("qh"), QS=at("qs", "ql"))


def dequant_raw(raw: torch.Tensor, qtype, k: int, out: torch.Tensor, r0: int = 0, r1: int | None = None) -> torch.Tensor:
    """Rows ``r0:r1`` of raw blocks ``(N, row_bytes)`` -> ``out`` bf16 ``(r1 - r0, K)``."""
    q = info(qtype)
    r1 = raw.shape[0] if r1 is None else r1
    rows = raw[r0:r1]
    n = r1 - r0
    assert rows.dtype == torch.uint8 and rows.shape[1] == q.row_bytes(k)
    assert out.dtype == torch.bfloat16 and out.shape == (n, k) and out.stride(1) == 1
    grid = (triton.cdiv(n, 16), triton.cdiv(k, 256))
    _dequant_raw_kernel[grid](rows, out, out, n, k, n, rows.stride(0), out.stride(0),
                              TID=_TID[q.qtype], TYPE_SIZE=q.type_size, BLOCK_N=16, num_warps=4,
                              **_offsets(q.qtype))
    return out


#: the types :func:`embed_rows` dequantizes itself (the others go through the core's dequantizer)
EMBED_TYPES = frozenset(_TID)


def embed_rows(table: torch.Tensor, qtype, k: int, tokens: torch.Tensor) -> torch.Tensor:
    """Rows ``tokens`` ((T,) int64, on the device) of raw blocks ``table (vocab, row_bytes)`` ->
    float32 ``(T, k)``: one launch, the token ids read on the device (the embedding op,
    ``minfer_embed_candidates``)."""
    q = info(qtype)
    if q.qtype not in EMBED_TYPES:
        from minfer_core.reference import embed_rows as plain

        return plain(table, qtype, k, tokens)
    assert table.dtype == torch.uint8 and table.shape[1] == q.row_bytes(k) and table.stride(1) == 1
    n = tokens.shape[0]
    out = torch.empty(n, k, dtype=torch.float32, device=table.device)
    grid = (triton.cdiv(n, 16), triton.cdiv(k, 256))
    _dequant_raw_kernel[grid](table, out, tokens, n, k, table.shape[0], table.stride(0), out.stride(0),
                              TID=_TID[q.qtype], TYPE_SIZE=q.type_size, BLOCK_N=16, num_warps=4,
                              GATHER=True, OUT_F32=True, **_offsets(q.qtype))
    return out
