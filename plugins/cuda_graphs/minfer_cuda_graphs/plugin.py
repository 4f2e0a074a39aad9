"""Hook implementations of the ``cuda_graphs`` plugin (the graph machinery is in ``graph``).

Turn it off with ``-p no:cuda_graphs`` (blocks the plugin), ``MINFER_LOAD_PLUGINS`` without it,
or a policy whose ``order.decode_step`` (``order.prefill_step``, ``order.batch_step``) does not
list it; decode (prompts, the batched engine's decode-only steps) then run eagerly.
"""

from __future__ import annotations

from minfer_core.hookspecs import hookimpl

NAME = "cuda_graphs"


@hookimpl
def minfer_applicable(ctx):
    import torch

    if ctx.device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device (it captures CUDA work)"
    return None


@hookimpl
def minfer_wrap_decode_step(step, ctx):
    from .graph import graphed_step

    return graphed_step(step, ctx.device)


@hookimpl
def minfer_wrap_prefill_step(step, ctx):
    from .graph import graphed_prefill

    return graphed_prefill(step, ctx.device)


@hookimpl
def minfer_wrap_batch_step(step, padding, ctx):
    from .graph import graphed_batch

    return graphed_batch(step, padding, ctx.device)
