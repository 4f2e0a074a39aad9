"""The q4_K plane (:class:`Q4KPlane`, ``MINFER_MMQ_Q4K_DSC``: "decoded scales"), read by the prefill
GEMMs and the decode GEMVs alike, so a q4_K weight needs no raw blocks once it exists.

4.625 bits per value (raw q4_K: 4.5), exact (every field is the GGUF's own, unpacked):
    ``qs``  nibble plane (see ``planes``), ``q`` in 0..15
    ``sc``  uint8 ``(N, K // 32, 2)``: the 6-bit scale ``sc`` and min ``m`` of each 32-value
            sub-block (q4_K's packed 12 bytes decoded)
    ``dm``  float16 ``(N, K // 256, 2)``: the block's ``d`` and ``dmin``;
            ``w = (d * sc) * q - (dmin * m)``.
Byte offsets of the raw block come from ``minfer_core.quants.BLOCK_FIELDS``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import field, info

BLOCK_BYTES = info(QT.Q4_K).type_size
D_AT = field(QT.Q4_K, "d")[0]
SC_AT, SC_BYTES = field(QT.Q4_K, "scales")
QS_AT, QS_BYTES = field(QT.Q4_K, "qs")
assert field(QT.Q4_K, "dmin")[0] == D_AT + 2  # d and dmin read as one pair

CHUNK_ROWS = 2048  # rows per build step: bounds the temporaries (~30 bytes per value)


@dataclass
class Q4KPlane:
    qs: torch.Tensor  # uint8 (N, K // 2), nibble plane
    sc: torch.Tensor  # uint8 (N, K // 32, 2): 6-bit scale, 6-bit min
    dm: torch.Tensor  # float16 (N, K // 256, 2): d, dmin

    def nbytes(self) -> int:
        return self.qs.numel() + self.sc.numel() + self.dm.numel() * 2

    def words(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``qs``, ``sc`` and ``dm`` as int32 words, as the decode GEMVs read them: ``(N, K / 8)``,
        ``(N, K / 64)`` (two sub-blocks' scale and min a word), ``(N, K / 256)`` (``d | dmin``)."""
        return (self.qs.view(torch.int32), self.sc.view(self.sc.shape[0], -1).view(torch.int32),
                self.dm.view(torch.int32))

    def scale_words(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``sc`` and ``dm`` as the prefill GEMMs read them: int16 ``(N, K / 32)`` (``sc | m << 8`` a
        sub-block) and int32 ``(N, K / 256)`` (``d | dmin << 16`` a block)."""
        n = self.sc.shape[0]
        return self.sc.view(n, -1).view(torch.int16), self.dm.view(n, -1).view(torch.int32)


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_K's 12 packed bytes ``(..., 12)`` -> eight 6-bit scales and mins, uint8 ``(..., 8)``."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return sc, mn


def _pack_nibbles(vals: torch.Tensor) -> torch.Tensor:
    """uint8 values ``(R, K)`` < 16 in natural order -> the nibble plane ``(R, K // 2)``."""
    v = vals.reshape(vals.shape[0], -1, 2, 64)
    return (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(vals.shape[0], -1)


def build_q4k(raw: torch.Tensor, k: int) -> Q4KPlane:
    """q4_K blocks ``(N, K // 256 * 144)`` uint8 -> :class:`Q4KPlane` on the same device."""
    n, nb = raw.shape[0], k // 256
    qs = torch.empty(n, k // 2, dtype=torch.uint8, device=raw.device)
    scm = torch.empty(n, k // 32, 2, dtype=torch.uint8, device=raw.device)
    dm = torch.empty(n, nb, 2, dtype=torch.float16, device=raw.device)
    for r0 in range(0, n, CHUNK_ROWS):
        b = raw[r0:r0 + CHUNK_ROWS].reshape(-1, nb, BLOCK_BYTES)
        rows = b.shape[0]
        sc, mn = _k4_scales(b[..., SC_AT:SC_AT + SC_BYTES])
        scm[r0:r0 + rows] = torch.stack([sc, mn], dim=-1).reshape(rows, k // 32, 2)
        dm[r0:r0 + rows] = b[..., D_AT:D_AT + 4].contiguous().view(torch.float16).reshape(rows, nb, 2)
        q = b[..., QS_AT:QS_AT + QS_BYTES].reshape(rows, nb, 4, 1, 32)  # 32-byte groups: low nibble first 32 values
        shift = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device).view(1, 1, 1, 2, 1)
        vals = ((q >> shift) & 0xF).reshape(rows, k)
        qs[r0:r0 + rows] = _pack_nibbles(vals)
    return Q4KPlane(qs, scm, dm)
