"""Test helpers: the independent oracle (``gguf.quants``) and error measures."""

from __future__ import annotations

import numpy as np
import torch
from gguf.quants import dequantize as gguf_dequantize


def oracle(raw: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """gguf's own numpy dequantizer for raw rows ``(n, row_bytes)``: float32 ``(n, k)`` on CPU."""
    arr = raw.cpu().numpy()
    return torch.from_numpy(gguf_dequantize(arr, qtype).reshape(arr.shape[0], k).astype(np.float32))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(||out - ref||_F / ||ref||_F, max|out - ref| / max|ref|), in float64; NaN fails both."""
    o, r = out.double().cpu(), ref.double().cpu()
    if not bool(torch.isfinite(o).all()):
        return float("inf"), float("inf")
    return float((o - r).norm() / r.norm()), float((o - r).abs().max() / r.abs().max())
