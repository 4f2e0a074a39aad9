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

#: Byte layout of one block of each quantized type: field -> ``(offset, bytes)``, in ggml's order
#: (``d``: float16 scale; ``m`` / ``dmin``: float16 min; ``scales``: packed or int8 sub-block scales;
#: ``qh``: high bits; ``qs`` / ``ql``: low bits). The fields tile the block exactly.
BLOCK_FIELDS: dict[QT, dict[str, tuple[int, int]]] = {
    QT.Q4_0: {"d": (0, 2), "qs": (2, 16)},
    QT.Q4_1: {"d": (0, 2), "m": (2, 2), "qs": (4, 16)},
    QT.Q5_0: {"d": (0, 2), "qh": (2, 4), "qs": (6, 16)},
    QT.Q5_1: {"d": (0, 2), "m": (2, 2), "qh": (4, 4), "qs": (8, 16)},
    QT.Q8_0: {"d": (0, 2), "qs": (2, 32)},
    QT.Q2_K: {"scales": (0, 16), "qs": (16, 64), "d": (80, 2), "dmin": (82, 2)},
    QT.Q3_K: {"hmask": (0, 32), "qs": (32, 64), "scales": (96, 12), "d": (108, 2)},
    QT.Q4_K: {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qs": (16, 128)},
    QT.Q5_K: {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qh": (16, 32), "qs": (48, 128)},
    QT.Q6_K: {"ql": (0, 128), "qh": (128, 64), "scales": (192, 16), "d": (208, 2)},
}


def field(qtype, name: str) -> tuple[int, int]:
    """``(offset, bytes)`` of field ``name`` inside one block of ``qtype`` (see ``BLOCK_FIELDS``)."""
    return BLOCK_FIELDS[QT(qtype)][name]



def info(qtype) -> QuantInfo:
    """Look up a type; ``KeyError`` names it when the reference backend cannot read it."""
    try:
        return QUANTS[QT(qtype)]
    except (KeyError, ValueError):
        name = getattr(qtype, "name", str(qtype))
        raise KeyError(f"unsupported tensor type {name}") from None
