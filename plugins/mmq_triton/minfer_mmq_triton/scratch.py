"""Just-in-time matmul plumbing: activation fetch, bf16 scratch, cuBLAS with a float32 result.

The scratch is transient: one ``torch.empty`` per matmul, which torch's caching allocator hands
back from the same block every layer (no persistent weight copy). Weights larger than
``SCRATCH_MAX`` elements (e.g. a 152k-row output head) are expanded and multiplied in row
chunks, so the scratch never exceeds 512 MiB.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

import torch

from minfer_core.weights import Activation

SCRATCH_MAX = 1 << 28  # bf16 elements


def bf16_rows(act: Activation) -> torch.Tensor:
    """The activation as contiguous bf16 ``(M, K)``: the producer's plane when there is one."""
    if act.plane is not None:
        return act.plane
    return act.f32.to(torch.bfloat16)


@lru_cache(maxsize=None)
def _has_out_dtype(device_type: str) -> bool:
    """Whether ``torch.mm(..., out_dtype=float32)`` (bf16 in, f32 out in one cuBLAS call) runs here."""
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError):
        return False


def probe(device) -> None:
    """Settle which GEMM entry point ``mm_f32`` uses on ``device`` (call at load time)."""
    _has_out_dtype(torch.device(device).type)


def mm_f32(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a`` bf16 ``(M, K)`` @ ``w`` bf16 ``(N, K)``.T (+ bias) -> float32 ``(M, N)``.

    On CUDA one cuBLAS GEMM writes float32 directly (torch >= 2.8); on the CPU (interpreter tests)
    the bf16 operands are multiplied in float32, the same product up to summation order.
    """
    if _has_out_dtype(a.device.type):
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


def jit_matmul(a: torch.Tensor, n: int, k: int, bias: Optional[torch.Tensor],
               fill: Callable[[torch.Tensor, int, int], torch.Tensor]) -> torch.Tensor:
    """Expand the weight with ``fill(scratch, r0, r1)`` (rows ``r0:r1`` as bf16) and multiply."""
    step = max(1, SCRATCH_MAX // k)
    if n <= step:
        w = fill(torch.empty(n, k, dtype=torch.bfloat16, device=a.device), 0, n)
        return mm_f32(a, w, bias)
    y = torch.empty(a.shape[0], n, dtype=torch.float32, device=a.device)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        w = fill(torch.empty(r1 - r0, k, dtype=torch.bfloat16, device=a.device), r0, r1)
        mm_f32(a, w, None if bias is None else bias[r0:r1], out=y[:, r0:r1])
    return y
