"""Q8_0 matmul over a registration-time plane.

A Q8_0 block stores 32 values as one float16 scale ``d`` followed by 32 int8 quants ``q``; the
value is ``d * q``. Registration splits the blocks into an int8 plane ``(n_out, n_in)`` and a
float32 scale plane ``(n_out, n_in / 32)``; the matmul rebuilds float32 weight rows from them.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Activation, Weight

PLANE = "example.q8_0"
BLOCK, BLOCK_BYTES = 32, 34


def serves(weight: Weight) -> bool:
    return QT(weight.qtype) == QT.Q8_0


def build_plane(raw: torch.Tensor, n_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    """raw: uint8 (n_out, n_in / 32 * 34) -> (quants int8 (n_out, n_in), scales f32 (n_out, n_in / 32))."""
    n_out = raw.shape[0]
    blocks = raw.reshape(n_out, n_in // BLOCK, BLOCK_BYTES)
    scales = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1).float()
    quants = blocks[..., 2:].contiguous().view(torch.int8).reshape(n_out, n_in)
    return quants, scales


def matmul_fn(weight: Weight):
    def fn(x) -> torch.Tensor:
        """x: f32 (M, n_in) or an Activation -> f32 (M, n_out)."""
        if isinstance(x, Activation):
            x = x.f32 if x.f32 is not None else x.plane.float()
        plane = weight.planes.get(PLANE)
        if plane is None:  # registered before this plugin was loaded, or planned only
            plane = weight.planes[PLANE] = build_plane(weight.raw, weight.n_in)
        quants, scales = plane
        w = (quants.view(weight.n_out, -1, BLOCK).float() * scales[..., None]).view(weight.n_out, weight.n_in)
        y = x.float() @ w.T
        return y + weight.bias if weight.bias is not None else y

    return fn
