"""The batched step's matmuls (hook ``minfer_batch_matmul_candidates``): kernels over all of a step's
rows at once whose per-row bits never depend on the row count or on the other rows.

q4_K and q6_K weights on CUDA (compute capability 8.0+, ``MINFER_DECODE_MMA`` on) run on the
tensor-core rows GEMMs (``q4_k.gemm_mma``, ``q6_k.gemm_mma``; labels ``mmq.rows.q4_k``,
``mmq.rows.q6_k``), reading the same planes as the decode GEMVs; their tile and split come from the
weight's shape alone (``tiles.rows_config``). RMSNorm and SwiGLU are applied by the quantizer, the
bias and the residual in the epilogue. On Hopper the q4_K weights that ``tiles.wgmma_batch`` names run
on the warpgroup-MMA GEMM instead (``prefill.gemm_wgmma``, label ``mmq.rows.wgmma.q4_k``) in groups of
``tiles.WGMMA_BATCH_ROWS`` rows, the producer applied by its staging kernel. Under ``MINFER_PDL``
(compute capability 9.0+) their launches overlap like the decode step's (``launch.pdl``). Other types
are not offered: the batched step runs them over fixed row tiles.
"""

from __future__ import annotations

from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Candidate, Weight

from . import planes, tiles
from .decode import mma_enabled, prepare, wgmma_enabled
from .launch.pdl import enabled as pdl_enabled

PLUGIN = "mmq_triton"
LABELS = {QT.Q4_K: "mmq.rows.q4_k", QT.Q6_K: "mmq.rows.q6_k"}
WGMMA_LABEL = "mmq.rows.wgmma.q4_k"
FUSES = ("residual", "rmsnorm", "swiglu")


def batch_candidates(weight: Weight, ctx) -> list[Candidate]:
    """The rows GEMM for a q4_K or q6_K weight on a GPU that can run it, else ``[]``."""
    label = LABELS.get(weight.qtype)
    if label is None or weight.n_in % 256 or not mma_enabled(ctx):
        return []
    if wgmma_enabled(ctx) and tiles.wgmma_batch(weight.qtype, weight.n_out, weight.n_in):
        label = WGMMA_LABEL
    if weight.raw is None and not {planes.KEY_Q4K, planes.KEY_DECODE} & weight.planes.keys():
        return [Candidate(PLUGIN, label, _unbuilt(label), fuses=FUSES, reads_raw=False)]  # planning only
    if label == WGMMA_LABEL:
        return [Candidate(PLUGIN, label, _wgmma_fn(weight, pdl_enabled(ctx)), fuses=FUSES, reads_raw=False)]
    if weight.qtype == QT.Q4_K:  # Gluon: CUDA only
        from .q4_k.gemm_mma import gemm_q4p_mma as gemm
    else:
        from .q6_k.gemm_mma import gemm_q6_mma as gemm

    plane = prepare(weight)
    t, g, warps, split = tiles.rows_config(weight.n_out, weight.n_in)
    pdl = pdl_enabled(ctx)

    def fn(x: torch.Tensor, residual: Optional[torch.Tensor] = None, norm: Optional[tuple] = None,
           swiglu: bool = False) -> torch.Tensor:
        if norm is not None and swiglu:
            raise ValueError("the rows GEMM applies RMSNorm or SwiGLU to x, not both")
        x = x.float().contiguous()
        res = None if residual is None else residual.float().contiguous()
        return gemm(x, plane, weight.bias, t, g, warps, split, res, norm, swiglu, pdl=pdl)

    return [Candidate(PLUGIN, label, fn, fuses=FUSES, reads_raw=False)]


def _wgmma_fn(weight: Weight, pdl: bool):
    """The warpgroup-MMA GEMM over a step's rows, ``tiles.WGMMA_BATCH_ROWS`` at a time."""
    from .prefill.gemm_wgmma import gemm_wgmma

    plane = prepare(weight)
    split, group = tiles.wgmma_split(weight.n_out, weight.n_in), tiles.WGMMA_BATCH_ROWS

    def fn(x: torch.Tensor, residual: Optional[torch.Tensor] = None, norm: Optional[tuple] = None,
           swiglu: bool = False) -> torch.Tensor:
        x = x.float().contiguous()
        res = None if residual is None else residual.float().contiguous()
        if x.shape[0] <= group:
            return gemm_wgmma(x, plane, weight.bias, group, split, pdl, res, norm, swiglu)
        return torch.cat([gemm_wgmma(x[i:i + group], plane, weight.bias, group, split, pdl,
                                     None if res is None else res[i:i + group], norm, swiglu)
                          for i in range(0, x.shape[0], group)])

    return fn


def _unbuilt(label: str):
    def fn(x, **kw):
        raise RuntimeError(f"{label}: planned without weights (minfer gates -m); load the model to run it")
    return fn
