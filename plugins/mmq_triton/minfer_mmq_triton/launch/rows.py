"""Host side of the batched step's tensor-core GEMMs (``q4_k.gemm_mma``, ``q6_k.gemm_mma``): x quantized
in the rows layout (``ops.quant_x``), the launch over ``(row groups, weight tiles, splits)``, and the
split-K partials added in a fixed order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.quant_x import quantize_x
from ..tiles import ROWS_AHEAD
from .pdl import enter, launch_args


@triton.jit
def _reduce_splits_kernel(part_ptr, bias_ptr, res_ptr, y_ptr, M, N, SPLIT: tl.constexpr,
                          HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``y = sum_s part[s] (s = 0, 1, ... in order) + bias + residual`` over (M, N)."""
    enter(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < M * N
    y = tl.load(part_ptr + i, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        y += tl.load(part_ptr + s * M * N + i, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + i % N, mask=mask, other=0.0)
    if HAS_RES:
        y += tl.load(res_ptr + i, mask=mask, other=0.0)
    tl.store(y_ptr + i, y, mask=mask)


def rows_gemm(kernel, weights: tuple, n: int, steps: int, x: torch.Tensor, bias, tiles: int, groups: int,
              num_warps: int, split: int, residual=None, norm=None, swiglu: bool = False,
              ahead: int | None = None, pdl: bool = False) -> torch.Tensor:
    """``kernel[grid](xq, xs, xsum, *weights, bias, residual, y, M, MP, n, steps, HAS_BIAS=, HAS_RES=, T=,
    G=, SPLIT=, AHEAD=, PDL=)`` over float32 ``x`` ``(M, K)`` (``(M, 2K)`` with ``swiglu``) -> float32 ``(M, n)``
    ``= [residual +] f(x) @ W.T + bias``, ``f`` the optional RMSNorm (``norm=(w, eps)``) or SwiGLU applied
    by the quantizer. ``groups``: at most this many 8-row groups a program; ``ahead``: blocks between
    a block's L2 prefetch and its loads (0: none; default ``tiles.ROWS_AHEAD`` when one program
    covers all the rows, else none); ``pdl``: the quantizer, the GEMM and the reduction launch with
    programmatic dependent launch (``launch.pdl``), the GEMM asking L2 for its first block's weight
    lines before it waits. No choice here changes a row's bits."""
    m = x.shape[0]
    groups = min(groups, triton.next_power_of_2(triton.cdiv(m, 8)))
    if ahead is None:
        ahead = ROWS_AHEAD if m <= 8 * groups else 0
    xq, xs, xsum = quantize_x(x, norm, swiglu, pdl=pdl, rows=True, pad=max(16, 8 * groups))
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    out = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    if residual is not None:
        assert residual.shape == y.shape and residual.is_contiguous()
    b = bias if bias is not None else y
    r = residual if residual is not None else y
    grid = (triton.cdiv(m, 8 * groups), triton.cdiv(n, 16 * tiles * num_warps), split)
    kernel[grid](xq, xs, xsum, *weights, b, r, out, m, xs.shape[1], n, steps, HAS_BIAS=bias is not None,
                 HAS_RES=residual is not None, T=tiles, G=groups, SPLIT=split, AHEAD=ahead, num_warps=num_warps,
                 **launch_args(pdl))
    if split > 1:
        reduce_splits(out, bias, residual, y, pdl)
    return y


def reduce_splits(part: torch.Tensor, bias, residual, y: torch.Tensor, pdl: bool = False) -> None:
    """``y (M, N) = sum of part[s] (SPLIT, M, N) in order s = 0, 1, ... [+ bias] [+ residual]``."""
    split, m, n = part.shape
    block = 1024
    _reduce_splits_kernel[(triton.cdiv(m * n, block),)](
        part, bias if bias is not None else y, residual if residual is not None else y, y, m, n, SPLIT=split,
        HAS_BIAS=bias is not None, HAS_RES=residual is not None, BLOCK=block, **launch_args(pdl))
