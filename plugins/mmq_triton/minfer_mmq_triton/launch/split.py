"""Split-K for the decode GEMVs (and the shared scratch of the fused plane GEMM's): more programs per
matrix, same result bits every run.

A GEMV over a long row (or with few output rows) leaves most of the GPU idle while each program
walks its row in a chain of dependent loads. With ``SPLIT > 1`` program ``(n, s)`` sums only
super-blocks ``[s * per, (s + 1) * per)``, writes its partial row sums to a scratch, and counts
itself in on an arrival counter. The program that arrives last adds the ``SPLIT`` partials in
the fixed order ``s = 0, 1, ...`` (so the result never depends on which program finished
last), adds the bias, stores ``y`` and resets the counter to 0 for the next call. No second
launch, nothing read on the host: a CUDA graph replays it as it is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def program_rows(N, BN: tl.constexpr):
    """A GEMV program of grid ``(cdiv(N, BN), SPLIT, M)``: ``(pid, split s, activation row, its BN
    output rows, those rows clamped to N - 1 as int64)``; out-of-range rows re-read the last row
    and are never stored."""
    pid = tl.program_id(0)
    rows = pid * BN + tl.arange(0, BN)
    return pid, tl.program_id(1), tl.program_id(2), rows, tl.minimum(rows, N - 1).to(tl.int64)


@triton.jit
def split_range(NB, s, SPLIT: tl.constexpr, BB: tl.constexpr):
    """Blocks ``[lo, hi)`` of split ``s``: ``ceil(NB / SPLIT)`` rounded up to whole steps of BB."""
    per = tl.cdiv(tl.cdiv(NB, SPLIT), BB) * BB
    lo = s * per
    return lo, tl.minimum(lo + per, NB)


@triton.jit
def store_rows(y, rows, N, xm, pid_n, s, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
               HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Write row sums ``y`` [BN] of activation row ``xm`` (directly, or through the split scratch).

    ``bias_ptr + xm * stride_bm`` is added: a bias vector (``stride_bm = 0``) or, with the row
    stride of an ``(M, N)`` tensor, a residual (the decode step's ``h + x @ W.T`` in one kernel)."""
    rmask = rows < N
    if SPLIT == 1:
        if HAS_BIAS:
            y += tl.load(bias_ptr + xm * stride_bm + rows, mask=rmask, other=0.0)
        tl.store(y_ptr + xm * stride_ym + rows, y, mask=rmask)
    else:
        part = part_ptr + xm * (SPLIT * N)
        tl.store(part + s * N + rows, y, mask=rmask)
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        cnt = cnt_ptr + xm * n_blocks + pid_n
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tot = tl.load(part + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            for t in tl.static_range(1, SPLIT):
                tot += tl.load(part + t * N + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(bias_ptr + xm * stride_bm + rows, mask=rmask, other=0.0)
            tl.store(y_ptr + xm * stride_ym + rows, tot, mask=rmask)
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


def whole_steps(nb: int, bb: int, split: int) -> bool:
    """Whether every split (see :func:`split_range`) covers whole steps of BB blocks: no masks needed."""
    per = -(-(-(-nb // split)) // bb) * bb
    return nb % per == 0


class SplitScratch:
    """Per-weight partial sums and zeroed arrival counters, one set per activation row count."""

    def __init__(self, n: int, bn: int, split: int):
        self.n, self.split, self.n_blocks = n, split, triton.cdiv(n, bn)
        self._bufs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (m, str(device))
        buf = self._bufs.get(key)
        if buf is None:
            if self.split == 1:
                dummy = torch.empty(1, dtype=torch.float32, device=device)
                buf = (dummy, torch.zeros(1, dtype=torch.int32, device=device))
            else:
                buf = (torch.empty(m * self.split * self.n, dtype=torch.float32, device=device),
                       torch.zeros(m * self.n_blocks, dtype=torch.int32, device=device))
            self._bufs[key] = buf
        return buf


_SHARED: dict[tuple, torch.Tensor] = {}


def shared_scratch(kind: str, numel: int, device) -> torch.Tensor:
    """Split-K partials (float32) or arrival counters (int32, zero between calls) for kernels that
    do not keep a :class:`SplitScratch` per weight (the fused plane GEMM), shared by every call whose
    size rounds up to the same power of two (so a few buffers serve every row count):
    kernels on one stream never overlap, and the counters return to zero. Buffers are never freed,
    as a captured CUDA graph may hold their addresses."""
    numel = 1 << max(0, numel - 1).bit_length()
    key = (kind, numel, str(device))
    buf = _SHARED.get(key)
    if buf is None:
        buf = (torch.empty if kind == "part" else torch.zeros)(
            numel, dtype=torch.float32 if kind == "part" else torch.int32, device=device)
        _SHARED[key] = buf
    return buf


def bias_or_residual(bias: torch.Tensor | None, residual: torch.Tensor | None, y: torch.Tensor):
    """``(pointer tensor, row stride, HAS_BIAS)`` for :func:`store_rows`: at most one of the two
    (the caller adds a residual itself when the weight also has a bias)."""
    if residual is not None:
        assert bias is None and residual.shape == y.shape and residual.stride(-1) == 1
        return residual, residual.stride(0), True
    return (bias if bias is not None else y), 0, bias is not None
