"""The bf16 weight cache and the cuBLAS matmuls over it (labels ``f16.gemm`` / ``f16.gemv``).

``weight.planes[KEY]`` holds the copy: bfloat16 ``(N, K)`` dequantized from the GGUF blocks by
the core's :func:`minfer_core.dequant.dequantize` (row chunks bound the float32 temporaries),
a bf16 view of BF16 weights, or the float32 view of F32 weights. bf16 rather than f16: the
activations are cast to the weight's dtype, and bf16 cannot overflow on large activations.
Products accumulate in float32 and come back as float32 (``torch.mm(..., out_dtype=float32)``
where torch offers it, else a float32 product).
"""

from __future__ import annotations

from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.dequant import dequantize
from minfer_core.linalg import mm_f32
from minfer_core.quants import QUANTS
from minfer_core.weights import Activation, Candidate, Weight

PLUGIN = "f16_wmma"
KEY = "f16_wmma.w16"
CHUNK_ROWS = 8192
MMQ_GATE = "MINFER_MMQ"


def servable(weight: Weight) -> bool:
    """Any type the core can dequantize (by type only: the core may plan without loading bytes)."""
    try:
        qt = QT(weight.qtype)
    except ValueError:
        return False
    return qt in QUANTS


def mmq_off(ctx) -> bool:
    """Whether prefill falls to this plugin for every weight (so the copy is built at registration)."""
    if not ctx.gates.get(MMQ_GATE, True):
        return True
    applicable = getattr(ctx, "applicable", {})  # filled by the core before registration
    return bool(applicable) and applicable.get("mmq_triton", "not loaded") is not None  # cannot run, or absent


def build(weight: Weight) -> torch.Tensor:
    """The copy for ``weight`` (no caching; see :func:`weight_cache`)."""
    qt = QT(weight.qtype)
    raw = weight.raw
    if qt == QT.F32:
        return raw.view(torch.float32).reshape(weight.n_out, weight.n_in)
    if qt == QT.BF16:
        return raw.view(torch.bfloat16).reshape(weight.n_out, weight.n_in)
    out = torch.empty(weight.n_out, weight.n_in, dtype=torch.bfloat16, device=raw.device)
    for r0 in range(0, weight.n_out, CHUNK_ROWS):
        out[r0:r0 + CHUNK_ROWS] = dequantize(raw[r0:r0 + CHUNK_ROWS], qt, weight.n_in)
    return out


def weight_cache(weight: Weight) -> torch.Tensor:
    w = weight.planes.get(KEY)
    if w is None:
        if weight.raw is None:
            raise RuntimeError(f"f16_wmma: {weight.name} has neither raw blocks nor a bf16 copy")
        w = weight.planes[KEY] = build(weight)
    return w


def matmul(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``a (M, K) @ w (N, K).T (+ bias)`` -> float32 ``(M, N)``; ``a`` is cast to ``w``'s dtype."""
    if w.dtype == torch.float32:
        y = a.float() @ w.t()
        return y + bias if bias is not None else y
    return mm_f32(a.to(w.dtype), w, bias)


def candidate(weight: Weight, phase: str) -> Candidate:
    def fn(x) -> torch.Tensor:
        if isinstance(x, Activation):
            x = x.plane if x.plane is not None else x.f32
        return matmul(x, weight_cache(weight), weight.bias)

    built = KEY in weight.planes  # built at registration: the raw bytes are not read again
    if phase == "prefill":
        return Candidate(PLUGIN, "f16.gemm", fn, reads=("plane", "f32"), reads_raw=not built)
    return Candidate(PLUGIN, "f16.gemv", fn, reads_raw=not built)
