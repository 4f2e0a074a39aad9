"""Candidates for the fused elementwise ops (the core ranks them by the policy's order; no gate)."""

from __future__ import annotations

import functools

from minfer_core.weights import Candidate

from ..launch.pdl import enabled as pdl_enabled
from .argmax import argmax_rows
from .norm import rmsnorm_row
from .rope import rope_kv_rows, rope_kv_write


def prefill_op_candidates(kind: str, ctx=None) -> list[Candidate] | None:
    """The multi-row fused ops of the prefill and the batched step (ranked by the policy's prefill
    order, no gate)."""
    if kind == "prefill_rope_kv":
        return [Candidate("mmq_triton", "mmq.pre.rope_kv", functools.partial(rope_kv_rows, pdl=pdl_enabled(ctx)))]
    return None


def decode_op_candidates(kind: str, ctx) -> list[Candidate] | None:
    """The single-token fused ops (the core ranks them by the policy's decode order)."""
    pdl = pdl_enabled(ctx)
    if kind == "decode_rmsnorm":
        return [Candidate("mmq_triton", "mmq.dec.rmsnorm", functools.partial(rmsnorm_row, pdl=pdl))]
    if kind == "decode_rope_kv":
        return [Candidate("mmq_triton", "mmq.dec.rope_kv", functools.partial(rope_kv_write, pdl=pdl))]
    if kind == "argmax":
        return [Candidate("mmq_triton", "mmq.argmax", argmax_rows)]
    if kind == "embed":
        from ..prefill.dequant_raw import embed_rows

        return [Candidate("mmq_triton", "mmq.embed", embed_rows)]
    return None
