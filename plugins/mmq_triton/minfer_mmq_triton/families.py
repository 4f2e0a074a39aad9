"""The quant types this plugin serves, by kernel family: the one list. Block layouts (sizes, byte
offsets) are the core's (``minfer_core.quants``)."""

from __future__ import annotations

from gguf import GGMLQuantizationType as QT

#: 32-value blocks (``legacy/``): one decode kernel over their aligned plane.
LEGACY = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
#: 256-value super-blocks (``q4_k/``, ``q5_k/``, ``q6_k/``).
KQUANTS = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
#: Every type with a prefill kernel (raw-block expansion reads them all) and a decode GEMV.
SERVED = LEGACY + KQUANTS
#: Types the int8 decode GEMVs (dp4a, tensor cores) and the prefill plane GEMMs cover.
INT8 = (QT.Q4_K, QT.Q6_K)
