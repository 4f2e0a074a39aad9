"""q6_K planes: the prefill's registration-time plane (:class:`Q6KPlane`) and the decode plane
(:class:`Q6KDecodePlane`). Byte offsets come from ``minfer_core.quants.BLOCK_FIELDS``
(q6_K block: ``ql[128] | qh[64] | scales int8[16] | d``).

``Q6KPlane`` (``MINFER_MMQ_Q6K_EXP``: "expanded"), 7 bits per value, read by the prefill GEMMs:
    ``ql``  nibble plane (see ``planes``), low 4 bits of the 6-bit ``q``
    ``qh``  uint8 ``(N, K // 4)``: for every 256-value span at ``k0``, byte ``k0 // 4 + i``
            (``i < 64``) holds the high 2 bits of value ``k0 + 64 * f + i`` at bits ``2f, 2f+1``
            (``f = 0..3``)
    ``sc``  float16 ``(N, K // 16)``: ``d * scale`` of each 16-value sub-block;
            ``w = sc * ((ql | qh << 4) - 32)``.
The builder returns ``None`` when a scale ``d * scale`` does not fit float16 (never seen in real
files); the GEMM family then reads that weight's raw blocks instead.

``Q6KDecodePlane``, read by the decode GEMVs (the same bytes as the raw blocks, 16-byte aligned):
    ``w`` uint8 ``(N, NB * DECODE_BYTES)``: each block's ``ql | qh | scales`` (raw order)
    ``d`` float16 ``(N, NB)``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import field, info

BLOCK_BYTES = info(QT.Q6_K).type_size
QL_AT, QL_BYTES = field(QT.Q6_K, "ql")
QH_AT, QH_BYTES = field(QT.Q6_K, "qh")
SC_AT, SC_BYTES = field(QT.Q6_K, "scales")
D_AT = field(QT.Q6_K, "d")[0]
#: Bytes of a block in the decode plane's ``w``: everything before ``d`` (ql | qh | scales).
DECODE_BYTES = D_AT
assert QL_AT == 0 and D_AT + 2 == BLOCK_BYTES  # the decode plane: the block up to d, then d apart

CHUNK_ROWS = 2048  # rows per build step: bounds the temporaries (~30 bytes per value)


@dataclass
class Q6KPlane:
    ql: torch.Tensor  # uint8 (N, K // 2), nibble plane
    qh: torch.Tensor  # uint8 (N, K // 4), 2-bit fields
    sc: torch.Tensor  # float16 (N, K // 16)

    def nbytes(self) -> int:
        return self.ql.numel() + self.qh.numel() + self.sc.numel() * 2


@dataclass
class Q6KDecodePlane:
    w: torch.Tensor
    d: torch.Tensor

    def nbytes(self) -> int:
        return self.w.numel() + self.d.numel() * 2


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte ``at`` of each block ``(..., type_size)``, as float32 ``(..., 1)``."""
    return b[..., at:at + 2].contiguous().view(torch.float16).float()


def _to_f16(x: torch.Tensor) -> torch.Tensor | None:
    y = x.to(torch.float16)
    return y if bool(torch.isfinite(y).all()) else None


def build_q6k(raw: torch.Tensor, k: int) -> Q6KPlane | None:
    """q6_K blocks ``(N, K // 256 * 210)`` uint8 -> :class:`Q6KPlane` on the same device."""
    n, nb = raw.shape[0], k // 256
    ql = torch.empty(n, k // 2, dtype=torch.uint8, device=raw.device)
    qh = torch.empty(n, k // 4, dtype=torch.uint8, device=raw.device)
    sc = torch.empty(n, k // 16, dtype=torch.float16, device=raw.device)
    sh2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device)
    for r0 in range(0, n, CHUNK_ROWS):
        b = raw[r0:r0 + CHUNK_ROWS].reshape(-1, nb, BLOCK_BYTES)
        rows = b.shape[0]
        s = _to_f16(_f16(b, D_AT) * b[..., SC_AT:SC_AT + SC_BYTES].contiguous().view(torch.int8).float())
        if s is None:
            return None
        sc[r0:r0 + rows] = s.reshape(rows, k // 16)
        ql[r0:r0 + rows] = b[..., QL_AT:QL_AT + QL_BYTES].reshape(rows, k // 2)  # already the nibble plane order
        # raw qh: byte 32h + l holds value 128h + 32j + l at bits 2j (h: 128-half, j: 0..3)
        hb = (b[..., QH_AT:QH_AT + QH_BYTES].reshape(rows, nb, 2, 1, 32) >> sh2.view(1, 1, 1, 4, 1)) & 3
        hb = hb.reshape(rows, nb, 4, 64)  # natural order, split as (f, i): value 64f + i
        packed = hb[:, :, 0] | (hb[:, :, 1] << 2) | (hb[:, :, 2] << 4) | (hb[:, :, 3] << 6)
        qh[r0:r0 + rows] = packed.reshape(rows, k // 4)
    return Q6KPlane(ql, qh, sc)


def pack_q6k(raw: torch.Tensor, k: int) -> Q6KDecodePlane:
    """Raw q6_K rows ``(N, K // 256 * 210)`` -> :class:`Q6KDecodePlane` on the same device."""
    b = raw.reshape(raw.shape[0], k // 256, BLOCK_BYTES)
    return Q6KDecodePlane(w=b[:, :, :DECODE_BYTES].contiguous().reshape(raw.shape[0], -1),
                          d=b[:, :, D_AT:D_AT + 2].contiguous().view(torch.float16).reshape(raw.shape[0], -1))


def unpack_q6k(p: Q6KDecodePlane) -> torch.Tensor:
    """The raw q6_K rows a :class:`Q6KDecodePlane` was built from."""
    n, nb = p.d.shape
    out = torch.empty(n, nb, BLOCK_BYTES, dtype=torch.uint8, device=p.d.device)
    out[:, :, :DECODE_BYTES] = p.w.reshape(n, nb, DECODE_BYTES)
    out[:, :, D_AT:D_AT + 2] = p.d.reshape(n, nb, 1).view(torch.uint8)
    return out.reshape(n, nb * BLOCK_BYTES)
