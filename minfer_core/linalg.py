"""The bf16 GEMMs the kernel plugins share (cuBLAS through torch): a float32 result, or a bf16 one."""

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


def _probe_operand() -> torch.Tensor:
    """A (32, 64) bf16 CUDA matrix of small exact values for the probes below (no global RNG draw)."""
    return (torch.arange(32 * 64, device="cuda") % 13 - 6).view(32, 64).bfloat16() / 8


@lru_cache(maxsize=None)
def writes_out(device_type: str) -> bool:
    """Whether that GEMM also writes a given contiguous float32 tensor (``out=``) with the bits it
    returns otherwise, so that row tiles land in their rows of one output without a copy."""
    if not has_out_dtype(device_type):
        return device_type == "cpu"
    try:
        a = _probe_operand()
        y = torch.empty(64, 32, device="cuda")
        torch.mm(a, a[:32].t(), out_dtype=torch.float32, out=y[16:48])
        return torch.equal(y[16:48], torch.mm(a, a[:32].t(), out_dtype=torch.float32))
    except (TypeError, RuntimeError):
        return False


@lru_cache(maxsize=None)
def adds_in_gemm(device_type: str) -> bool:
    """Whether ``torch.addmm(c, ..., out_dtype=float32)`` runs here for a float32 ``c`` of the
    output's shape or a bias row: cuBLAS then adds it in the GEMM's epilogue (no second pass)."""
    if not has_out_dtype(device_type):
        return False
    try:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        full = torch.addmm(torch.ones(16, 16, device="cuda"), a, a, out_dtype=torch.float32)
        row = torch.addmm(torch.ones(16, device="cuda"), a, a, out_dtype=torch.float32)
        return full.dtype == row.dtype == torch.float32 and bool((full == 17).all() and (row == 17).all())
    except (TypeError, RuntimeError):
        return False


@lru_cache(maxsize=None)
def adds_in_place(device_type: str) -> bool:
    """Whether ``torch.addmm(c, ..., out_dtype=float32, out=c)`` writes the sum over ``c`` with the bits
    of the out-of-place call: cuBLAS then reads and writes ``c`` in the epilogue, where the out-of-place
    call first copies ``c`` into a new output (a full pass over it)."""
    if not adds_in_gemm(device_type):
        return False
    try:
        a = _probe_operand()
        c = (torch.arange(32 * 32, device="cuda") % 7 - 3).view(32, 32) / 4
        want = torch.addmm(c, a, a[:32].t(), out_dtype=torch.float32)
        got = torch.addmm(c, a, a[:32].t(), out_dtype=torch.float32, out=c)
        return got.data_ptr() == c.data_ptr() and torch.equal(c, want)
    except (TypeError, RuntimeError):
        return False


def probe(device) -> None:
    """Settle which GEMM entry point :func:`mm_f32` uses on ``device`` (call at load time)."""
    adds_in_place(torch.device(device).type)
    writes_out(torch.device(device).type)


def mm_f32(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None,
           out: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None,
           into_residual: bool = False) -> torch.Tensor:
    """``[residual +] a`` bf16 ``(M, K)`` @ ``w`` bf16 ``(N, K)``.T (+ bias) -> float32 ``(M, N)``, into
    ``out`` when given (written by the GEMM itself where it is contiguous and :func:`writes_out`).

    On CUDA one cuBLAS GEMM writes float32 directly (torch >= 2.8), adding the bias or the float32
    ``residual`` ``(M, N)`` in its epilogue where :func:`adds_in_gemm`, over the residual itself with
    ``into_residual`` (the caller gives it up) where :func:`adds_in_place`; on the CPU (interpreter
    tests) the bf16 operands are multiplied in float32, the same product up to summation order.
    """
    dev = a.device.type
    into = {"out": out} if out is not None and out.is_contiguous() and writes_out(dev) else {}
    c = residual if bias is None else bias if residual is None else None
    if c is not None and not into and adds_in_gemm(dev):
        if into_residual and c is residual and residual.is_contiguous() and adds_in_place(dev):
            return torch.addmm(c, a, w.t(), out_dtype=torch.float32, out=c)
        return torch.addmm(c, a, w.t(), out_dtype=torch.float32)
    if has_out_dtype(dev):
        y = torch.mm(a, w.t(), out_dtype=torch.float32, **into)
    elif a.is_cuda:  # older torch: bf16 result, widened (one extra pass over the output)
        y = torch.mm(a, w.t()).float()
    else:
        y = torch.mm(a.float(), w.float().t(), **into)
    if bias is not None:
        y += bias
    if residual is not None:
        y += residual
    if out is not None and y is not out:
        out.copy_(y)
        return out
    return y


def mm_bf16(a: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``a`` bf16 ``(M, K)`` @ ``w`` bf16 ``(N, K)``.T (+ bias) -> bf16 ``(M, N)``: cuBLAS's bf16 GEMM
    (float32 sums, the result rounded once; a bias is rounded to bf16 first); on the CPU the
    operands are multiplied in float32 and the result rounded."""
    if not a.is_cuda:
        y = torch.mm(a.float(), w.float().t())
        return (y if bias is None else y + bias).to(torch.bfloat16)
    if bias is None:
        return torch.mm(a, w.t())
    return torch.addmm(bias.to(torch.bfloat16), a, w.t())
