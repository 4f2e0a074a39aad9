"""The one quant-type table (block sizes, byte layouts) shared by reader, reference backend and kernels.

Dequantizers live in :mod:`minfer_core.dequant`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT


@dataclass(frozen=True)
class QuantInfo:
    qtype: QT
    block_size: int  # values per block
    type_size: int  # bytes per block

    @property
    def name(self) -> str:
        return self.qtype.name

    def row_bytes(self, n_cols: int) -> int:
        """Bytes of one row of ``n_cols`` values (``n_cols`` must be a multiple of the block)."""
        if n_cols % self.block_size:
            raise ValueError(f"{self.name}: row of {n_cols} values is not a multiple of {self.block_size}")
        return n_cols // self.block_size * self.type_size


#: The types the reference backend can read.
SUPPORTED = (
    QT.F32, QT.F16, QT.BF16,
    QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
)

QUANTS: dict[QT, QuantInfo] = {t: QuantInfo(t, *GGML_QUANT_SIZES[t]) for t in SUPPORTED}


def info(qtype) -> QuantInfo:
    """Look up a type; ``KeyError`` names it when the reference backend cannot read it."""
    try:
        return QUANTS[QT(qtype)]
    except (KeyError, ValueError):
        name = getattr(qtype, "name", str(qtype))
        raise KeyError(f"unsupported tensor type {name}") from None
