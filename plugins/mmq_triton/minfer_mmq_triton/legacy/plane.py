"""Decode plane of the legacy 32-value types (q4_0, q4_1, q5_0, q5_1, q8_0): the GGUF blocks, whose
fields are not 16-byte aligned, split per row into aligned arrays holding exactly the same bytes
(no rounding: a decode result does not depend on which prefill planes the gates built).

:class:`LegacyPlane`:
    ``qs`` uint8 ``(N, NB * QB)``: each block's quant bytes (``QB`` = 16, or 32 for q8_0)
    ``qh`` int32 ``(N, NB)``: q5 high bits (bit ``i`` belongs to value ``i``), else ``None``
    ``d``  float16 ``(N, NB)``; ``m`` float16 ``(N, NB)`` for q4_1/q5_1, else ``None``

``NB`` is the number of blocks per row. Field offsets come from ``minfer_core.quants.BLOCK_FIELDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.quants import BLOCK_FIELDS, info




@dataclass
class LegacyPlane:
    qs: torch.Tensor
    qh: Optional[torch.Tensor]
    d: torch.Tensor
    m: Optional[torch.Tensor]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.qh, self.d, self.m) if t is not None)


def _layout(qtype) -> tuple[int, int, Optional[int], Optional[int], int, int]:
    """(block bytes, offset of d, of m or None, of qh or None, of qs, qs bytes)."""
    qt = QT(qtype)
    f = BLOCK_FIELDS[qt]
    off = lambda name: f[name][0] if name in f else None  # noqa: E731
    return info(qt).type_size, off("d"), off("m"), off("qh"), off("qs"), f["qs"][1]


def _field(b: torch.Tensor, at: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes ``at .. at+size`` of every block ``(N, NB, TS)`` as ``(N, NB * size // itemsize)``."""
    n = b.shape[0]
    return b[:, :, at:at + size].contiguous().view(dtype).reshape(n, -1)


def pack_legacy(raw: torch.Tensor, qtype, k: int) -> LegacyPlane:
    """Raw rows ``(N, K // 32 * TS)`` of a legacy type -> :class:`LegacyPlane` on the same device."""
    ts, od, om, oh, oq, qb = _layout(qtype)
    b = raw.reshape(raw.shape[0], k // 32, ts)
    return LegacyPlane(
        qs=_field(b, oq, qb, torch.uint8),
        qh=_field(b, oh, 4, torch.int32) if oh is not None else None,
        d=_field(b, od, 2, torch.float16),
        m=_field(b, om, 2, torch.float16) if om is not None else None,
    )


def unpack_legacy(p: LegacyPlane, qtype) -> torch.Tensor:
    """The raw rows a :class:`LegacyPlane` was built from (exact inverse of :func:`pack_legacy`)."""
    ts, od, om, oh, oq, qb = _layout(qtype)
    n, nb = p.d.shape
    out = torch.empty(n, nb, ts, dtype=torch.uint8, device=p.d.device)
    out[:, :, od:od + 2] = p.d.reshape(n, nb, 1).view(torch.uint8)
    if om is not None:
        out[:, :, om:om + 2] = p.m.reshape(n, nb, 1).view(torch.uint8)
    if oh is not None:
        out[:, :, oh:oh + 4] = p.qh.reshape(n, nb, 1).view(torch.uint8)
    out[:, :, oq:oq + qb] = p.qs.reshape(n, nb, qb)
    return out.reshape(n, nb * ts)
