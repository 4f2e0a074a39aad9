"""Random, well-scaled GGUF blocks on any device (benchmarks and GPU tests; not an oracle)."""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from minfer_core.quants import BLOCK_FIELDS

from .families import LEGACY, SERVED

#: byte offsets of each type's float16 scale fields inside a block
F16_FIELDS = {qt: tuple(BLOCK_FIELDS[qt][f][0] for f in ("d", "m", "dmin") if f in BLOCK_FIELDS[qt])
              for qt in SERVED}


def random_raw(qtype: QT, n: int, k: int, device, seed: int = 0) -> torch.Tensor:
    """uint8 ``(n, row_bytes)``: random quant bits; float16 scales of magnitude 2^-10..2^-6."""
    bs, ts = GGML_QUANT_SIZES[qtype]
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = torch.randint(0, 256, (n * k // bs, ts), dtype=torch.uint8, device=device, generator=g)
    for at in F16_FIELDS[qtype]:
        u = torch.rand(blocks.shape[0], device=device, generator=g)
        mag = torch.exp2(-10 + 4 * u)
        if at == BLOCK_FIELDS[qtype]["d"][0] and qtype in LEGACY:  # signed d; K-quant d and mins >= 0
            mag = mag * torch.where(torch.rand_like(u) < 0.5, -1.0, 1.0)
        blocks[:, at:at + 2] = mag.to(torch.float16).view(torch.uint8).view(-1, 2)
    return blocks.view(n, -1)
