"""The batched step's matmuls (hook ``minfer_batch_matmul_candidates``): kernels over all of a step's
rows at once whose per-row bits never depend on the row count or on the other rows.

q4_K weights on CUDA (compute capability 8.0+, ``MINFER_DECODE_MMA`` on) run on the tensor-core
rows GEMM (``q4_k.gemm_mma``, label ``mmq.rows.q4_k``), reading the same q4_K plane as the decode
GEMV; its tile and split come from the weight's shape alone (``tiles.rows_config``). RMSNorm and
SwiGLU are applied by its quantizer, the bias and the residual in its epilogue. Other types are
not offered: the batched step runs them over fixed row tiles.
"""

from __future__ import annotations

from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Candidate, Weight

from . import planes
from .decode import mma_enabled, prepare
from .tiles import rows_config

PLUGIN = "mmq_triton"
LABEL = "mmq.rows.q4_k"
FUSES = ("residual", "rmsnorm", "swiglu")


def batch_candidates(weight: Weight, ctx) -> list[Candidate]:
    """The rows GEMM for a q4_K weight on a GPU that can run it, else ``[]``."""
    if weight.qtype != QT.Q4_K or weight.n_in % 256 or not mma_enabled(ctx):
        return []
    if weight.raw is None and planes.KEY_Q4K not in weight.planes and planes.KEY_DECODE not in weight.planes:
        return [Candidate(PLUGIN, LABEL, _unbuilt, fuses=FUSES, reads_raw=False)]  # planning only
    from .q4_k.gemm_mma import gemm_q4p_mma  # Gluon: CUDA only

    plane = prepare(weight)
    t, g, warps, split = rows_config(weight.n_out, weight.n_in)

    def fn(x: torch.Tensor, residual: Optional[torch.Tensor] = None, norm: Optional[tuple] = None,
           swiglu: bool = False) -> torch.Tensor:
        if norm is not None and swiglu:
            raise ValueError("the rows GEMM applies RMSNorm or SwiGLU to x, not both")
        x = x.float().contiguous()
        res = None if residual is None else residual.float().contiguous()
        return gemm_q4p_mma(x, plane, weight.bias, t, g, warps, split, res, norm, swiglu)

    return [Candidate(PLUGIN, LABEL, fn, fuses=FUSES, reads_raw=False)]


def _unbuilt(x, **kw):
    raise RuntimeError(f"{LABEL}: planned without weights (minfer gates -m); load the model to run it")
