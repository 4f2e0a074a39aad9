"""Planes: GGUF blocks repacked at registration for 16-byte loads; the keys they are stored under
in ``weight.planes`` and their builders. The layouts live with their families
(``q4_k.plane``, ``q6_k.plane``, ``legacy.plane``).

Built once per weight at load time (plain torch ops on the weight's device, in row chunks). The
prefill GEMMs (``prefill.gemm_planes``) read the q4_K / q6_K planes, and the decode GEMVs read the
q4_K plane too (``q4_k.gemv``): with both reading it, the raw q4_K blocks are no longer needed and
the core releases them. All planes are row-major per output row ``n``, so fused weights (QKV,
gate|up) stay concatenations of rows. ``K`` is a multiple of 256.

Nibble plane (shared by q4_K and q6_K): uint8 ``(N, K // 2)``. For every 128-value span starting
at ``k0`` (``k0 % 128 == 0``), byte ``k0 // 2 + i`` (``i < 64``) holds value ``k0 + i`` in its
low nibble and value ``k0 + 64 + i`` in its high nibble. A 64-byte load thus yields two
contiguous 64-value runs. (This is exactly q6_K's own ``ql`` order; q4_K's 32-value pairing is
repacked.)

Decode planes (``KEY_DECODE``, built by ``decode.prepare``): the q4_K plane, q6_K's
``Q6KDecodePlane`` and the legacy types' ``LegacyPlane``, the same bytes as the raw blocks.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

from .q4_k.plane import Q4KPlane, build_q4k  # noqa: F401
from .q6_k.plane import Q6KPlane, build_q6k  # noqa: F401

KEY_Q4K = "mmq_triton.q4k"
KEY_Q6K = "mmq_triton.q6k"
KEY_W16 = "mmq_triton.w16"  # MINFER_MMQ_RAW=0: a bf16 (N, K) copy, no blocks read at run time
KEY_DECODE = "mmq_triton.gemv"  # the decode GEMVs' plane

CHUNK_ROWS = 2048  # rows per build step: bounds the temporaries


def build_w16(raw: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """Any supported block type -> a bfloat16 ``(N, K)`` copy (the ``MINFER_MMQ_RAW=0`` path)."""
    from minfer_core.dequant import dequantize

    out = torch.empty(raw.shape[0], k, dtype=torch.bfloat16, device=raw.device)
    for r0 in range(0, raw.shape[0], CHUNK_ROWS):
        out[r0:r0 + CHUNK_ROWS] = dequantize(raw[r0:r0 + CHUNK_ROWS], qtype, k)
    return out


BUILDERS = {QT.Q4_K: (KEY_Q4K, build_q4k), QT.Q6_K: (KEY_Q6K, build_q6k)}
