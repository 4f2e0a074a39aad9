"""RMSNorm of the few float32 rows of a decode step, one program per row (one launch, graph friendly)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch.pdl import enter, launch_args


@triton.jit
def _rmsnorm_kernel(
    # pointers
    x_ptr, w_ptr, out_ptr,
    # sizes
    E, eps,
    # strides
    stride_xm, stride_om,
    # meta
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """Row ``m = program_id(0)``: ``out[m] = x[m] * rsqrt(mean(x[m]^2) + eps) * w``; x (M, E), w (E,)."""
    m = tl.program_id(0)
    e = tl.arange(0, BLOCK)
    mask = e < E
    # the weights (no kernel writes them) load before the wait, so that only x's load follows it
    w = tl.load(w_ptr + e, mask=mask, other=0.0).to(tl.float32)
    enter(PDL)
    x = tl.load(x_ptr + m * stride_xm + e, mask=mask, other=0.0).to(tl.float32)
    # stage 1: mean of squares in float32 (padding lanes load 0 and add nothing)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / E + eps)
    # stage 2: scale and weigh
    tl.store(out_ptr + m * stride_om + e, x * r * w, mask=mask)



def rmsnorm_row(x: torch.Tensor, w: torch.Tensor, eps: float, pdl: bool = False) -> torch.Tensor:
    """RMSNorm of x float32 (M, E) with weight w float32 (E,) -> new float32 (M, E); one launch.

    Meant for decode (M small); each row is one program holding all of E (up to 8192) at once.
    """
    if x.dim() != 2 or x.dtype != torch.float32 or w.dtype != torch.float32:
        raise ValueError(f"rmsnorm_row wants float32 x (M, E) and w (E,), got {x.dtype} {tuple(x.shape)}")
    m, e = x.shape
    if w.shape != (e,) or not w.is_contiguous() or x.stride(1) != 1:
        raise ValueError("rmsnorm_row: w must be (E,) contiguous and rows of x contiguous")
    out = torch.empty(m, e, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(e)
    _rmsnorm_kernel[(m,)](
        x, w, out,
        e, float(eps),
        x.stride(0), out.stride(0),
        BLOCK=block, num_warps=max(1, min(16, block // 256)), **launch_args(pdl),
    )
    return out

