"""The one bf16 GEMM with a float32 result that the kernel plugins share (cuBLAS through torch)."""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch


@lru_cache(maxsize=None)
def has_out_dtype(device_type: str) -> bool:
    """Whether ``torch.mm(..., out_dtype=float32)`` (bf16 in, f32 out in one cuBLAS call) runs here."""
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False


def probe(device) -> None:
    """Settle which GEMM entry point :func:`mm_f32` uses on ``device`` (call at load time)."""
    has_out_dtype(torch.device(device).type)


def mm_f32(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a`` bf16 ``(M, K)`` @ ``w`` bf16 ``(N, K)``.T (+ bias) -> float32 ``(M, N)``.

    On CUDA one cuBLAS GEMM writes float32 directly (torch >= 2.8); on the CPU (interpreter tests)
    the bf16 operands are multiplied in float32, the same product up to summation order.
    """
    if has_out_dtype(a.device.type):
        y = torch.mm(a, w.t(), out_dtype=torch.float32)
    elif a.is_cuda:  # older torch: bf16 result, widened (one extra pass over the output)
        y = torch.mm(a, w.t()).float()
    else:
        y = torch.mm(a.float(), w.float().t())
    if bias is not None:
        y += bias
    if out is not None:
        out.copy_(y)
        return out
    return y
