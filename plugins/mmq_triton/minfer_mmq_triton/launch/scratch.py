"""Just-in-time matmul plumbing: activation fetch, bf16 scratch, cuBLAS with a float32 (or bf16) result.

The scratch is transient: one ``torch.empty`` per matmul, which torch's caching allocator hands
back from the same block every layer (no persistent weight copy). Weights larger than
``SCRATCH_MAX`` elements (e.g. a 152k-row output head) are expanded and multiplied in row
chunks, so the scratch never exceeds 512 MiB.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from minfer_core.linalg import mm_bf16, mm_f32
from minfer_core.weights import Activation

SCRATCH_MAX = 1 << 28  # bf16 elements


def bf16_rows(act: Activation) -> torch.Tensor:
    """The activation as contiguous bf16 ``(M, K)``: the producer's plane when there is one."""
    if act.plane is not None:
        return act.plane
    return act.f32.to(torch.bfloat16)


def product(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor] = None,
            out_bf16: bool = False) -> torch.Tensor:
    """``[residual +] a @ w.T (+ bias)`` in one cuBLAS GEMM where it can: float32 (over the residual,
    which the caller gives up), or bf16 with ``out_bf16`` (written so by the GEMM when there is no
    residual)."""
    if out_bf16 and residual is None:
        return mm_bf16(a, w, bias)
    y = mm_f32(a, w, bias, residual=residual, into_residual=True)
    return y.to(torch.bfloat16) if out_bf16 else y


def jit_matmul(a: torch.Tensor, n: int, k: int, bias: Optional[torch.Tensor],
               fill: Callable[[torch.Tensor, int, int], torch.Tensor], tile: Optional[int] = None,
               residual: Optional[torch.Tensor] = None, out_bf16: bool = False) -> torch.Tensor:
    """Expand the weight with ``fill(scratch, r0, r1)`` (rows ``r0:r1`` as bf16) and multiply;
    ``tile``: one GEMM per ``tile`` rows of ``a`` (a whole number of them) under each expansion,
    so that a row's bits depend on the tile's shape alone, not on how many rows ``a`` has.
    ``residual``: float32 ``(M, N)`` added to the product (in cuBLAS's epilogue where it can, never
    over ``tile``s: an epilogue is another GEMM, so one tile alone would not get the bits it gets
    among others); ``out_bf16``: the product as bf16 (the GEMM writes it so when there is one GEMM
    and no residual)."""
    parts = a.split(tile) if tile else (a,)
    step = max(1, SCRATCH_MAX // k)
    if n <= step and not tile:
        return product(a, fill(torch.empty(n, k, dtype=torch.bfloat16, device=a.device), 0, n), bias, residual,
                       out_bf16)
    # each GEMM writes its rows (and columns) of y; the bias is added once over all of them
    y = torch.empty(a.shape[0], n, dtype=torch.float32, device=a.device)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        w = fill(torch.empty(r1 - r0, k, dtype=torch.bfloat16, device=a.device), r0, r1)
        at = 0
        for p in parts:
            mm_f32(p, w, out=y[at:at + p.shape[0], r0:r1])
            at += p.shape[0]
    if bias is not None:
        y += bias
    if residual is not None:
        y += residual
    return y.to(torch.bfloat16) if out_bf16 else y
