"""Decode planes: GGUF blocks whose fields are not 16-byte aligned, split into aligned arrays.

The decode GEMVs read q5_K straight from ``weight.raw`` (its 176-byte blocks keep every field
16-byte aligned) and q4_K from its plane (``planes.Q4KPlane``, ``gemv_q4plane``). Every other
type is split once, per row, into a "structure of
arrays" holding exactly the same bytes (no rounding, no extra precision: a decode result does not
depend on which prefill planes the gates built), stored in ``weight.planes[KEY]``:

* legacy 32-value types (q4_0, q4_1, q5_0, q5_1, q8_0) -> :class:`LegacyPlane`
    ``qs`` uint8 ``(N, NB * QB)``: each block's quant bytes (``QB`` = 16, or 32 for q8_0)
    ``qh`` int32 ``(N, NB)``: q5 high bits (bit ``i`` belongs to value ``i``), else ``None``
    ``d``  float16 ``(N, NB)``; ``m`` float16 ``(N, NB)`` for q4_1/q5_1, else ``None``
* q6_K -> :class:`Q6KDecodePlane`
    ``w`` uint8 ``(N, NB * 208)``: each block's ``ql[128] | qh[64] | scales[16]`` (raw order)
    ``d`` float16 ``(N, NB)``

``NB`` is the number of blocks per row. The raw bytes stay while a chosen prefill kernel reads
them; otherwise the core releases them (``unpack_*`` rebuilds them exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

KEY = "mmq_triton.gemv"

#: type -> (block bytes, offset of d, offset of m or None, offset of qh or None, offset of qs, qs bytes)
LEGACY = {
    QT.Q4_0: (18, 0, None, None, 2, 16),
    QT.Q4_1: (20, 0, 2, None, 4, 16),
    QT.Q5_0: (22, 0, None, 2, 6, 16),
    QT.Q5_1: (24, 0, 2, 4, 8, 16),
    QT.Q8_0: (34, 0, None, None, 2, 32),
}


@dataclass
class LegacyPlane:
    qs: torch.Tensor
    qh: Optional[torch.Tensor]
    d: torch.Tensor
    m: Optional[torch.Tensor]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.qh, self.d, self.m) if t is not None)


@dataclass
class Q6KDecodePlane:
    w: torch.Tensor
    d: torch.Tensor

    def nbytes(self) -> int:
        return self.w.numel() + self.d.numel() * 2


def _field(b: torch.Tensor, at: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes ``at .. at+size`` of every block ``(N, NB, TS)`` as ``(N, NB * size // itemsize)``."""
    n = b.shape[0]
    return b[:, :, at:at + size].contiguous().view(dtype).reshape(n, -1)


def pack_legacy(raw: torch.Tensor, qtype, k: int) -> LegacyPlane:
    """Raw rows ``(N, K // 32 * TS)`` of a legacy type -> :class:`LegacyPlane` on the same device."""
    ts, od, om, oh, oq, qb = LEGACY[QT(qtype)]
    b = raw.reshape(raw.shape[0], k // 32, ts)
    return LegacyPlane(
        qs=_field(b, oq, qb, torch.uint8),
        qh=_field(b, oh, 4, torch.int32) if oh is not None else None,
        d=_field(b, od, 2, torch.float16),
        m=_field(b, om, 2, torch.float16) if om is not None else None,
    )


def unpack_legacy(p: LegacyPlane, qtype) -> torch.Tensor:
    """The raw rows a :class:`LegacyPlane` was built from (exact inverse of :func:`pack_legacy`)."""
    ts, od, om, oh, oq, qb = LEGACY[QT(qtype)]
    n, nb = p.d.shape
    out = torch.empty(n, nb, ts, dtype=torch.uint8, device=p.d.device)
    out[:, :, od:od + 2] = p.d.reshape(n, nb, 1).view(torch.uint8)
    if om is not None:
        out[:, :, om:om + 2] = p.m.reshape(n, nb, 1).view(torch.uint8)
    if oh is not None:
        out[:, :, oh:oh + 4] = p.qh.reshape(n, nb, 1).view(torch.uint8)
    out[:, :, oq:oq + qb] = p.qs.reshape(n, nb, qb)
    return out.reshape(n, nb * ts)


def pack_q6k(raw: torch.Tensor, k: int) -> Q6KDecodePlane:
    """Raw q6_K rows ``(N, K // 256 * 210)`` -> :class:`Q6KDecodePlane` on the same device."""
    b = raw.reshape(raw.shape[0], k // 256, 210)
    return Q6KDecodePlane(w=_field(b, 0, 208, torch.uint8), d=_field(b, 208, 2, torch.float16))


def unpack_q6k(p: Q6KDecodePlane) -> torch.Tensor:
    """The raw q6_K rows a :class:`Q6KDecodePlane` was built from."""
    n, nb = p.d.shape
    out = torch.empty(n, nb, 210, dtype=torch.uint8, device=p.d.device)
    out[:, :, :208] = p.w.reshape(n, nb, 208)
    out[:, :, 208:] = p.d.reshape(n, nb, 1).view(torch.uint8)
    return out.reshape(n, nb * 210)
