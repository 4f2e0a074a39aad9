"""Hook implementations of the ``f16_wmma`` plugin (the cache and the matmuls are in ``cache``).

It serves any weight type the core can dequantize, from a persistent bf16 copy (float32 weights
are used as they are). When the copy is built:

* at registration, for every weight, when the prefill mmq path is off: ``MINFER_MMQ=0``, or the
  context says mmq_triton cannot run here (``cache.mmq_off``);
* otherwise on the first call of one of its kernels, i.e. only for weights it really serves
  (a type mmq_triton does not cover, a policy or ``--backend`` that puts f16_wmma first).
"""

from __future__ import annotations

from minfer_core.hookspecs import hookimpl

NAME = "f16_wmma"


@hookimpl
def minfer_applicable(ctx):
    import torch

    if ctx.device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device (cuBLAS bf16 matmuls)"
    return None


@hookimpl
def minfer_register_weight(weight, ctx):
    from . import cache

    if cache.servable(weight) and weight.raw is not None and cache.mmq_off(ctx):
        cache.weight_cache(weight)


@hookimpl
def minfer_matmul_candidates(weight, phase, ctx):
    from . import cache

    if not cache.servable(weight):
        return None
    return [cache.candidate(weight, phase)]
