"""Programmatic dependent launch (PDL) for the decode step's kernels (compute capability 9.0+).

A decode step is a chain of ~10 short kernels per layer (2-40 us each); without PDL each one is
launched only after its predecessor has finished, then waits once more for the first bytes of its
weights. With PDL (``launch_pdl=True``) a kernel's programs may start while the previous kernel
still runs: GEMVs over small weights ask L2 for the first lines of their rows (read-only data no
kernel of the step writes), every kernel then waits at ``griddepcontrol.wait`` until the previous
kernel has finished and its writes are visible, and then lets the next kernel launch
(``griddepcontrol.launch_dependents``). The tensor-core GEMVs let it launch only when their loop is
done (``enter(PDL, False)`` ... :func:`release`), so their successor's programs are not launched
beside them for the whole loop (7B tg128 +0.9%, at depth 4,096 +0.6%; why that is faster was not
measured; releasing at the very end, one step earlier, or the short kernels releasing late too, lost).
A GEMV right behind a split GEMV (o -> gate|up with the quantizer between them taken out) takes twice as
long when its programs launch during that GEMV's split reduction and stores, and does not when that GEMV
releases after its stores (benchmarks/README.md, "the quantizer's launches").
A tensor-core GEMV also loads its first step's weight words before the wait (``EARLY`` of
``q4_k.gemv_mma``), so they travel while its predecessor ends (7B tg128 +1.8-1.9% beside gate|up's
register cap, ``tiles.MMA_TALL_REGS``).

Rules every kernel launched this way keeps, so the chain stays ordered as without PDL:

1. every program calls :func:`enter` (the wait) unconditionally: a kernel ends only after its
   predecessor has ended, hence after every kernel before it;
2. nothing an earlier kernel writes is read, and nothing at all is written, before :func:`enter`.

Kernels launched without the attribute (torch's) wait for their predecessor as always, and
``enter`` is a no-op for a kernel launched without it. Off on the CPU, below 9.0, and when
``MINFER_PDL=0`` (read once per load, for A/B runs and debugging).
"""

from __future__ import annotations


import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..tiles import PREFETCH_LINES, PREFETCH_MAX_VALUES



def enabled(ctx) -> bool:
    """Whether this load's decode kernels launch with PDL (CUDA, cc >= 9.0, ``MINFER_PDL`` not "0")."""
    if ctx is None or ctx.device.type != "cuda" or not ctx.gates.get("MINFER_PDL", True):
        return False
    cc = ctx.compute_capability
    return cc is not None and tuple(cc) >= (9, 0)


def prefetch_lines(n: int, k: int) -> int:
    """Lines per row a GEMV over an ``n x k`` weight prefetches under PDL (see PREFETCH_LINES)."""
    return PREFETCH_LINES if n * k < PREFETCH_MAX_VALUES else 0


def launch_args(on: bool) -> dict:
    """Keyword arguments of a kernel launch: the ``PDL`` constexpr, and Triton's launch attribute."""
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


def gemv_launch_args(on: bool, lines: int) -> dict:
    """:func:`launch_args` plus the GEMV kernels' ``PF`` (lines per row to prefetch; 0 without PDL)."""
    return {**launch_args(on), "PF": lines if on else 0}


@triton.jit
def _prefetch_l2(p):
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [p],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_rows(base, row_off, lo, hi, LINES: tl.constexpr):
    """Ask L2 for bytes ``[lo, hi)`` (at most LINES 128-byte lines from ``lo``) of each row;
    ``row_off`` [R] int64 byte offsets of the rows from ``base``. Addresses stay inside the rows."""
    if LINES > 0:
        p8 = base.to(tl.pointer_type(tl.int8), bitcast=True)
        off = tl.minimum(lo + tl.arange(0, LINES) * 128, hi - 1)
        _prefetch_l2(p8 + row_off[:, None] + off[None, :])


@triton.jit
def enter(PDL: tl.constexpr, RELEASE: tl.constexpr = True):
    """Wait for the previous kernel (its writes visible), then (RELEASE) let the next one launch."""
    if PDL:
        gdc_wait()
        if RELEASE:
            gdc_launch_dependents()


@triton.jit
def release(PDL: tl.constexpr):
    """Let the next kernel launch (a program that entered with ``RELEASE=False``)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def enter_gemv(PDL: tl.constexpr, w_ptr, row_off, lo, hi, LINES: tl.constexpr):
    """:func:`enter` for a GEMV program: first ask L2 for up to LINES lines of bytes ``[lo, hi)`` of
    each of its weight rows (``row_off`` byte offsets from ``w_ptr``; weights: nothing an earlier
    kernel writes)."""
    if PDL:
        _prefetch_rows(w_ptr, row_off, lo, hi, LINES)
    enter(PDL)
