"""Dequantize GGUF blocks with plain torch ops (any device): the reference backend's reader.

Each ``_<type>`` takes blocks ``(N, type_size)`` uint8 and returns ``(N, block_size)`` float32.
The arithmetic follows ggml's reference order (scale products first, one rounding per op), so
results are bit-identical to ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import info

#: Blocks per internal chunk: bounds the temporaries to a few hundred MB on big tensors.
CHUNK_BLOCKS = 1 << 19


def dequantize(raw: torch.Tensor, qtype, n_cols: int) -> torch.Tensor:
    """Raw uint8 rows ``(..., row_bytes)`` -> float32 ``(..., n_cols)`` on ``raw.device``.

    F32 input comes back as a view of ``raw`` (no copy). ``KeyError`` for an unsupported type,
    ``ValueError`` when ``raw`` does not hold whole rows of ``n_cols`` values.
    """
    q = info(qtype)
    if raw.dtype != torch.uint8:
        raise ValueError(f"dequantize wants uint8 bytes, got {raw.dtype}")
    row_bytes = q.row_bytes(n_cols)
    if raw.dim() == 0 or raw.shape[-1] != row_bytes:
        raise ValueError(f"{q.name}: rows of {n_cols} values take {row_bytes} bytes, got shape {tuple(raw.shape)}")
    lead = raw.shape[:-1]
    raw = raw.contiguous()
    if q.qtype in _FLOATS:
        return raw.view(_FLOATS[q.qtype]).to(torch.float32).reshape(*lead, n_cols)
    blocks = raw.reshape(-1, q.type_size)
    fn = _DEQUANT[q.qtype]
    if blocks.shape[0] <= CHUNK_BLOCKS:
        return fn(blocks).reshape(*lead, n_cols)
    out = torch.empty(blocks.shape[0], q.block_size, dtype=torch.float32, device=raw.device)
    for i in range(0, blocks.shape[0], CHUNK_BLOCKS):
        out[i:i + CHUNK_BLOCKS] = fn(blocks[i:i + CHUNK_BLOCKS])
    return out.reshape(*lead, n_cols)


_FLOATS = {QT.F32: torch.float32, QT.F16: torch.float16, QT.BF16: torch.bfloat16}


# -- helpers ------------------------------------------------------------------------------------

def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte ``at`` of each block, as float32 ``(N, 1)``."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _shifts(b: torch.Tensor, step: int) -> torch.Tensor:
    """Shift amounts 0, step, 2*step, ... < 8 as uint8 on ``b``'s device."""
    return torch.arange(0, 8, step, dtype=torch.uint8, device=b.device)


def _split(x: torch.Tensor, groups: int, width: int, step: int, mask: int) -> torch.Tensor:
    """Bit fields of bytes ``x (N, groups*width)`` -> ``(N, groups, 8 // step, width)``.

    Field ``k`` of byte ``j`` in group ``g`` is ``(x[g*width + j] >> k*step) & mask``.
    """
    sh = _shifts(x, step).view(1, 1, -1, 1)
    return (x.reshape(-1, groups, 1, width) >> sh) & mask


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Legacy 32-value blocks: low nibbles are values 0..15, high nibbles values 16..31."""
    return _split(qs, 1, 16, 4, 0xF).reshape(-1, 32)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """Four little-endian bytes per block -> their 32 bits ``(N, 32)`` (bit ``j`` at ``j``)."""
    return ((qh.unsqueeze(-1) >> _shifts(qh, 1)) & 1).reshape(-1, 32)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, float32 ``(N, 8)``."""
    s = s.reshape(-1, 3, 4)
    lo, mid, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=1)
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


# -- legacy 32-value blocks ---------------------------------------------------------------------

def _q4_0(b):  # d f16 | qs[16]
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).float() - 8)


def _q4_1(b):  # d f16 | m f16 | qs[16]
    return _f16(b, 0) * _nibbles(b[:, 4:20]).float() + _f16(b, 2)


def _q5_0(b):  # d f16 | qh u32 | qs[16]
    q = _nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.float() - 16)


def _q5_1(b):  # d f16 | m f16 | qh u32 | qs[16]
    q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b):  # d f16 | qs int8[32]
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).float()


# -- K-quants: 256-value super-blocks ---------------------------------------------------------------

def _q2_k(b):  # scales[16] (lo: scale, hi: min) | qs[64] | d f16 | dmin f16
    sc = b[:, :16]
    dl = (_f16(b, 80) * (sc & 0xF).float()).unsqueeze(-1)
    ml = (_f16(b, 82) * (sc >> 4).float()).unsqueeze(-1)
    q = _split(b[:, 16:80], 2, 32, 2, 3).reshape(-1, 16, 16).float()
    return (dl * q - ml).reshape(-1, 256)


def _q3_k(b):  # hmask[32] | qs[64] | scales[12] (6-bit, packed) | d f16
    lo = _split(b[:, 96:104], 1, 8, 4, 0xF).reshape(-1, 16)
    hi = _split(b[:, 104:108], 1, 4, 2, 3).reshape(-1, 16)
    dl = (_f16(b, 108) * ((lo | (hi << 4)).float() - 32)).unsqueeze(-1)
    ql = _split(b[:, 32:96], 2, 32, 2, 3).reshape(-1, 16, 16).float()
    hm = _split(b[:, :32], 1, 32, 1, 1).reshape(-1, 16, 16)  # set bit: no -4 offset
    q = ql - (hm ^ 1).float() * 4
    return (dl * q).reshape(-1, 256)


def _q4_k(b):  # d f16 | dmin f16 | scales[12] | qs[128]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).unsqueeze(-1)
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    q = _split(b[:, 16:144], 4, 32, 4, 0xF).reshape(-1, 8, 32).float()
    return (d * q - dm).reshape(-1, 256)


def _q5_k(b):  # d f16 | dmin f16 | scales[12] | qh[32] | qs[128]
    sc, mn = _k_scales(b[:, 4:16])
    d = (_f16(b, 0) * sc).unsqueeze(-1)
    dm = (_f16(b, 2) * mn).unsqueeze(-1)
    ql = _split(b[:, 48:176], 4, 32, 4, 0xF).reshape(-1, 8, 32)
    qh = _split(b[:, 16:48], 1, 32, 1, 1).reshape(-1, 8, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).reshape(-1, 256)


def _q6_k(b):  # ql[128] | qh[64] | scales int8[16] | d f16
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b, 208) * sc).unsqueeze(-1)
    ql = _split(b[:, :128], 2, 64, 4, 0xF).reshape(-1, 8, 32)
    qh = _split(b[:, 128:192], 2, 32, 2, 3).reshape(-1, 8, 32)
    q = ((ql | (qh << 4)).float() - 32).reshape(-1, 16, 16)
    return (d * q).reshape(-1, 256)


_DEQUANT = {
    QT.Q4_0: _q4_0, QT.Q4_1: _q4_1, QT.Q5_0: _q5_0, QT.Q5_1: _q5_1, QT.Q8_0: _q8_0,
    QT.Q2_K: _q2_k, QT.Q3_K: _q3_k, QT.Q4_K: _q4_k, QT.Q5_K: _q5_k, QT.Q6_K: _q6_k,
}
