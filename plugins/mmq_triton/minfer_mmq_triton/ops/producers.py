"""Fused producers: RMSNorm and SwiGLU that write the bf16 activation plane themselves, and the
prepass that converts an f32 activation once for all its consumers.

Fuse mode 1 writes the float32 rows and the plane; mode 2 writes the plane only (``f32=None``),
sound only when every consumer reads the plane (the core decides the mode). ``pdl``: launch with
programmatic dependent launch (``launch.pdl``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer_core.weights import Activation

from ..launch.pdl import enter, launch_args


@triton.jit
def _rmsnorm_kernel(
    # pointers
    x_ptr, w_ptr, y_ptr, p_ptr,
    # sizes
    K, eps,
    # strides (elements)
    stride_x, stride_y, stride_p,
    # meta
    WRITE_F32: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """One row per program: ``y = x * rsqrt(mean(x^2) + eps) * w``; x, y f32 ``(M, K)``, plane
    bf16 ``(M, K)``."""
    enter(PDL)
    row = tl.program_id(0)
    k = tl.arange(0, BLOCK_K)
    mask = k < K
    x = tl.load(x_ptr + row * stride_x + k, mask=mask, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
    y = x * r * tl.load(w_ptr + k, mask=mask, other=0.0)
    if WRITE_F32:
        tl.store(y_ptr + row * stride_y + k, y, mask=mask)
    tl.store(p_ptr + row * stride_p + k, y.to(tl.bfloat16), mask=mask)


@triton.jit
def _swiglu_kernel(
    # pointers
    gu_ptr, y_ptr, p_ptr,
    # sizes
    F,
    # strides (elements)
    stride_gu, stride_y, stride_p,
    # meta
    WRITE_F32: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """``y = silu(gu[:, :F]) * gu[:, F:]``; program ``(row, blk)`` covers ``BLOCK`` columns."""
    enter(PDL)
    row = tl.program_id(0)
    f = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = f < F
    g = tl.load(gu_ptr + row * stride_gu + f, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + F + f, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    if WRITE_F32:
        tl.store(y_ptr + row * stride_y + f, y, mask=mask)
    tl.store(p_ptr + row * stride_p + f, y.to(tl.bfloat16), mask=mask)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, write_f32: bool = True, pdl: bool = False) -> Activation:
    """x f32 ``(M, K)``, w f32 ``(K,)`` -> Activation (plane always, f32 when ``write_f32``)."""
    assert x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1 and w.shape == (x.shape[1],)
    m, k = x.shape
    y = torch.empty_like(x) if write_f32 else None
    p = torch.empty(m, k, dtype=torch.bfloat16, device=x.device)
    block = triton.next_power_of_2(k)
    _rmsnorm_kernel[(m,)](x, w, y if write_f32 else p, p, k, float(eps),
                          x.stride(0), y.stride(0) if write_f32 else 0, p.stride(0),
                          WRITE_F32=write_f32, BLOCK_K=block, num_warps=8 if block >= 4096 else 4,
                          **launch_args(pdl))
    return Activation(y, p)


def swiglu(gu: torch.Tensor, write_f32: bool = True, pdl: bool = False) -> Activation:
    """gu float32 or bf16 ``(M, 2F)`` (gate then up) -> Activation of ``silu(gate) * up`` ``(M, F)``
    (computed in float32)."""
    assert gu.dtype in (torch.float32, torch.bfloat16) and gu.dim() == 2 and gu.stride(1) == 1 and gu.shape[1] % 2 == 0
    m, f = gu.shape[0], gu.shape[1] // 2
    y = torch.empty(m, f, dtype=torch.float32, device=gu.device) if write_f32 else None
    p = torch.empty(m, f, dtype=torch.bfloat16, device=gu.device)
    block = min(2048, triton.next_power_of_2(f))
    _swiglu_kernel[(m, triton.cdiv(f, block))](gu, y if write_f32 else p, p, f,
                                               gu.stride(0), y.stride(0) if write_f32 else 0, p.stride(0),
                                               WRITE_F32=write_f32, BLOCK=block, num_warps=4,
                                               **launch_args(pdl))
    return Activation(y, p)


def prepass(x: torch.Tensor) -> Activation:
    """f32 ``(M, K)`` -> Activation(f32=x, plane=bf16 x): one conversion shared by all consumers."""
    return Activation(x, x.contiguous().to(torch.bfloat16))
