"""minfer_mmq_triton: hook implementations only (kernels are imported lazily, inside the hooks).

Prefill (16 or more rows): quantized matmuls reading GGUF blocks or their registration-time
planes, plus the fused activation producers; the gates that govern them (and two decode
switches) are declared in ``routes``. Decode and attention kernels live in ``decode`` and
``attention`` (delegated to when those modules exist).
"""

from __future__ import annotations

import os

from minfer_core.hookspecs import hookimpl

MIN_CC = (8, 0)


def _optional(module: str):
    """Import ``minfer_mmq_triton.<module>`` or return None when that module is not there."""
    import importlib

    name = f"{__package__}.{module}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


@hookimpl
def minfer_gates():
    from .routes import declared_gates

    return declared_gates()


@hookimpl
def minfer_applicable(ctx):
    """CUDA with compute capability >= 8.0; on the CPU only under Triton's interpreter.

    ``TRITON_INTERPRET`` is read here, once per load (it is how the CI runs these kernels on the
    CPU); no forward pass reads the environment.
    """
    try:
        import triton  # noqa: F401
    except ImportError:
        return "needs the triton package"
    dev = ctx.device
    if dev.type == "cuda":
        cc = ctx.compute_capability
        if cc is None:
            import torch
            cc = torch.cuda.get_device_capability(dev)
        if tuple(cc) >= MIN_CC:
            return None
        return f"needs a CUDA device with compute capability >= 8.0 (found {cc[0]}.{cc[1]})"
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return "needs a CUDA device with compute capability >= 8.0"


@hookimpl
def minfer_register_weight(weight, ctx):
    from .routes import register

    register(weight, ctx)


@hookimpl
def minfer_matmul_candidates(weight, phase, ctx):
    if phase == "decode":
        decode = _optional("decode")
        return None if decode is None else decode.decode_candidates(weight, ctx)
    from .routes import prefill_candidates

    return prefill_candidates(weight, ctx)


@hookimpl
def minfer_matmul_group_candidates(weights, phase, ctx):
    decode = _optional("decode") if phase == "decode" else None
    return None if decode is None else decode.group_candidates(weights, ctx)


@hookimpl
def minfer_batch_matmul_candidates(weight, ctx):
    batch = _optional("batch")
    return None if batch is None else batch.batch_candidates(weight, ctx)


@hookimpl
def minfer_fuse_proposal(weights, readers, ctx):
    from .routes import fuse_proposal

    return fuse_proposal(weights, readers, ctx)


@hookimpl
def minfer_rmsnorm_candidates(ctx):
    from .routes import producer_candidates

    return producer_candidates("rmsnorm", ctx)


@hookimpl
def minfer_swiglu_candidates(ctx):
    from .routes import producer_candidates

    return producer_candidates("swiglu", ctx)


@hookimpl
def minfer_prepass_candidates(ctx):
    from .routes import producer_candidates

    return producer_candidates("prepass", ctx)


@hookimpl
def minfer_decode_rmsnorm_candidates(ctx):  # single-token ops: no gate reads them
    from .ops.candidates import decode_op_candidates

    return decode_op_candidates("decode_rmsnorm", ctx)


@hookimpl
def minfer_decode_rope_kv_candidates(ctx):
    from .ops.candidates import decode_op_candidates

    return decode_op_candidates("decode_rope_kv", ctx)


@hookimpl
def minfer_argmax_candidates(ctx):
    from .ops.candidates import decode_op_candidates

    return decode_op_candidates("argmax", ctx)


@hookimpl
def minfer_embed_candidates(ctx):
    from .ops.candidates import decode_op_candidates

    return decode_op_candidates("embed", ctx)


@hookimpl
def minfer_prefill_rope_kv_candidates(ctx):  # not a quantized-matmul feature: no gate reads it either
    from .ops.candidates import prefill_op_candidates

    return prefill_op_candidates("prefill_rope_kv", ctx)


@hookimpl
def minfer_attention_candidates(phase, ctx):
    attention = _optional("ops.attention")
    return None if attention is None else attention.attention_candidates(phase, ctx)
