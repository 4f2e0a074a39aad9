"""The greedy pick: each row's first index of its largest logit, as ``torch.argmax`` chooses it
(a NaN counts as the largest), in two launches of a few microseconds.

torch's argmax reduces a single row of the vocabulary (152,064 logits) in one block (~8.5 us on the
H200); here ``_block_max`` spreads the row over one program per ``BLOCK`` logits and ``_row_max``
picks among their winners in order, so ties go to the lowest index exactly as torch's. A row's pick
reads that row alone: the same bits among any number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # logits a program (2,048-4,096 all take ~3 us for 152,064 on the H200)


@triton.jit
def _block_max(x_ptr, val_ptr, idx_ptr, nan_ptr, V, P, stride_x, BLOCK: tl.constexpr):
    """Block ``program_id(0)`` of row ``program_id(1)``: its largest value, the first index holding
    it, and the first index of a NaN (``V`` where none)."""
    b, r = tl.program_id(0), tl.program_id(1)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r * stride_x + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
    nan = x != x
    x = tl.where(nan, -float("inf"), x)
    m = tl.max(x, 0)
    tl.store(val_ptr + r * P + b, m)
    tl.store(idx_ptr + r * P + b, tl.min(tl.where((x == m) & (offs < V), offs, V), 0))
    tl.store(nan_ptr + r * P + b, tl.min(tl.where(nan, offs, V), 0))


@triton.jit
def _row_max(val_ptr, idx_ptr, nan_ptr, out_ptr, V, P, BP: tl.constexpr):
    """Row ``program_id(0)``: the first NaN if any, else the first index of the largest block value."""
    r = tl.program_id(0)
    p = tl.arange(0, BP)
    v = tl.load(val_ptr + r * P + p, mask=p < P, other=-float("inf"))
    i = tl.load(idx_ptr + r * P + p, mask=p < P, other=V)
    first_nan = tl.min(tl.load(nan_ptr + r * P + p, mask=p < P, other=V), 0)
    best = tl.min(tl.where(v == tl.max(v, 0), i, V), 0)
    tl.store(out_ptr + r, tl.where(first_nan < V, first_nan, best).to(tl.int64))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` of ``(R, V)`` (or ``(V,)``) float logits, rows contiguous: (R,) int64."""
    x = logits.reshape(1, -1) if logits.dim() == 1 else logits
    if x.stride(-1) != 1:
        x = x.contiguous()
    R, V = x.shape
    if R == 0 or V == 0 or V >= 2**31 - 1:
        return logits.argmax(dim=-1).reshape(R)  # torch's errors and int32-overflowing sizes
    P = triton.cdiv(V, BLOCK)
    val = torch.empty(R, P, device=x.device, dtype=torch.float32)
    idx = torch.empty(R, P, device=x.device, dtype=torch.int32)
    nan = torch.empty(R, P, device=x.device, dtype=torch.int32)
    out = torch.empty(R, device=x.device, dtype=torch.int64)
    _block_max[(P, R)](x, val, idx, nan, V, P, x.stride(0), BLOCK=BLOCK, num_warps=8)
    _row_max[(R,)](val, idx, nan, out, V, P, BP=max(triton.next_power_of_2(P), 16), num_warps=4)
    return out
