"""Decode matmuls (fewer than 16 activation rows): quantized GEMVs, one per GGUF type.

``decode_candidates(weight, ctx)`` is what ``plugin.py`` returns from
``minfer_matmul_candidates(weight, "decode", ctx)``. Each candidate's ``fn(x)`` takes float32
``(M, K)`` (M = 1 .. 15) and returns float32 ``(M, N) = x @ W.T + bias``; it reads no gate, no
environment and nothing on the host, so a decode step that calls it can be captured as a CUDA
graph. Labels: ``mmq.gemv.<type>`` (e.g. ``mmq.gemv.q4_k``).

Data read: q4_K from its plane (``q4_k.plane.Q4KPlane``, exact; the prefill's own plane when
registration built it, else built here), q5_K from ``weight.raw``, every other type from its
decode plane (``q6_k.plane``, ``legacy.plane``; built here once and kept in
``weight.planes[planes.KEY_DECODE]``, the same bytes as the raw blocks). The q4_K plane holds the
same values whoever built it, so which prefill planes exist never changes a decode result. No
decode kernel but q5_K's reads raw bytes (``Candidate.reads_raw``), so the core can release them.

Kernels: float GEMVs (``q4_k.gemv``, ``q5_k.gemv``, ``q6_k.gemv``, ``legacy.gemv``; ~1e-7 of
``sum |x w|``) for every type, and int8 dot products over a two-digit int8 copy of x (~1e-5;
``q6_k.gemv_i8``, ``q4_k.gemv``) for weights of 16 MiB or more and for the weights fed by an
RMSNorm (qkv, gate|up, output head), whose norm the quantizer applies. Short, wide matrices split
the row over several programs (``launch.split``, deterministic). ``tiles`` holds the tuned choices.

Fused pieces (``Candidate.fuses``, keyword arguments of ``fn``): every GEMV of a weight without a
bias adds ``residual=`` in its epilogue; every GEMV takes ``swiglu=True`` (x is ``[g | u]``), done
by the kernel that quantizes x (int8) or as the float kernels load x (``launch.prologue``); the
int8 GEMVs also take ``norm=(w, eps)`` (RMSNorm of x), applied by their quantizing kernel. The
tensor-core GEMV of a q4_K ``gate_up`` weight takes ``glu_out=True``: it returns an ``Activation``
whose ``forms`` also hold ``silu(g) * u`` of its product in ``quant_x.GLU_FORM``, written by its own
epilogue, which the tensor-core GEMVs of the down projection read (``fn(gu, swiglu=True, forms=...)``)
in place of quantizing ``gu``: one launch fewer a layer.

On CUDA (compute capability 8.0+) the q4_K and q6_K weights that take the int8 path run on tensor
cores instead (``q4_k.gemv_mma``, ``q6_k.gemv_mma``, MODE 3: same two-digit x, same exact integer
sub-block sums); ``MINFER_DECODE_MMA=0`` keeps the dp4a kernels (A/B runs, debugging), read once
per load like ``MINFER_PDL``.

A q4_K and a q6_K weight over one input (a Q4_K_M layer's q|k and v, which the loader cannot fuse)
run as one tensor-core launch, RMSNorm fused: ``group_candidates``, the plugin's answer to the hook
``minfer_matmul_group_candidates`` (``pair_mma``).

On compute capability 9.0+ the kernels launch with programmatic dependent launch (``launch.pdl``),
decided once per load from the load context (``MINFER_PDL=0`` turns it off); it changes when a
kernel starts, never what it computes. Under it the split tensor-core GEMVs also reduce their splits
inside a thread-block cluster (``launch.cluster``): the same sums in the same order, so the same bits.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Activation, Candidate, Weight

from . import planes
from .families import INT8, KQUANTS, SERVED
from .launch.pdl import enabled as pdl_enabled, prefetch_lines
from .legacy.plane import pack_legacy
from .ops.quant_x import FORM, GLU_FORM
from .q6_k.plane import pack_q6k
from .tiles import (PAIR_Q6K, decode_config, glu_fits, mma_config, mma_early, mma_max_regs,
                    q6k_evict_first)

PLUGIN = "mmq_triton"
MAX_ROWS = 15


def mma_enabled(ctx) -> bool:
    """Whether this load's q4_K / q6_K int8 GEMVs run on tensor cores (CUDA, cc >= 8.0, a Triton with
    Gluon, ``MINFER_DECODE_MMA`` not "0")."""
    if ctx is None or ctx.device.type != "cuda" or not ctx.gates.get("MINFER_DECODE_MMA", True):
        return False
    cc = ctx.compute_capability
    if cc is None or tuple(cc) < (8, 0):
        return False
    try:
        import triton.experimental.gluon  # noqa: F401  (Triton 3.4+)
    except ImportError:
        return False
    return True


def wgmma_enabled(ctx) -> bool:
    """Whether this load's q4_K / q6_K matmuls of few rows run on the warpgroup-MMA GEMM (``prefill.gemm_wgmma``):
    as :func:`mma_enabled`, on compute capability 9.0 (Hopper's wgmma)."""
    return mma_enabled(ctx) and tuple(ctx.compute_capability) == (9, 0)


def prepare(weight: Weight):
    """The data the GEMV reads: raw rows (q5_K) or the decode plane (built once)."""
    qt = QT(weight.qtype)
    if qt == QT.Q5_K:
        return weight.raw
    plane = weight.planes.get(planes.KEY_DECODE)
    if plane is None:
        if qt == QT.Q4_K:  # the prefill's plane if registration built it (same values either way)
            plane = weight.planes.get(planes.KEY_Q4K) or planes.build_q4k(weight.raw, weight.n_in)
        elif qt == QT.Q6_K:
            plane = pack_q6k(weight.raw, weight.n_in)
        else:
            plane = pack_legacy(weight.raw, qt, weight.n_in)
        weight.planes[planes.KEY_DECODE] = plane
    return plane


def fuses(config: tuple, bias, glu: bool = False) -> tuple[str, ...]:
    """What ``fn`` fuses besides the matmul (see the module docstring) under ``config``; ``glu``: it can
    write ``quant_x.GLU_FORM`` (:func:`writes_glu`)."""
    mode = config[3] if len(config) > 3 else 0
    out = () if bias is not None else ("residual",)
    return out + (("rmsnorm", "swiglu") if mode in (2, 3) else ("swiglu",)) + (("glu_out",) if glu else ())


def writes_glu(qt, config: tuple, n: int, bias, role: str) -> bool:
    """Whether the GEMV of a ``gate_up`` weight writes ``silu(g) * u`` too (``fn(x, glu_out=True)``): the
    q4_K tensor-core GEMV, no bias, a tiling that pairs whole blocks of gate and up rows."""
    if role != "gate_up" or bias is not None or QT(qt) != QT.Q4_K or len(config) < 5 or config[3] != 3:
        return False
    bn, _, warps, _, split = config[:5]
    return glu_fits(n, bn // (16 * warps), warps, split)


def reads_forms(config: tuple) -> tuple[str, ...]:
    """What ``fn`` reads of an activation (``Candidate.reads``): x, and under MODE 3 x already in
    ``quant_x.FORM`` (``fn(x, forms={FORM: ...})``, from the decode attention) or, for ``swiglu=True``,
    ``silu(g) * u`` in ``quant_x.GLU_FORM`` (from the gate|up GEMV)."""
    return ("f32", FORM, GLU_FORM) if len(config) > 3 and config[3] == 3 else ("f32",)


def make_gemv(qtype, data, bias: Optional[torch.Tensor], n: int, k: int,
              config: Optional[tuple] = None, role: str = "",
              pdl: bool = False, cluster: bool = False) -> Callable[..., torch.Tensor]:
    """``fn(x (M, K) f32, residual=None, norm=None, swiglu=False) -> (M, n) f32`` over prepared
    ``data`` (see :func:`prepare`); ``fn.fuses`` says which keywords the kernels do themselves
    (``glu_out`` for a ``gate_up`` weight under :func:`writes_glu`: an ``Activation`` then).
    ``pdl``: launch with programmatic dependent launch (``launch.pdl``; CUDA, compute capability 9.0+);
    ``cluster``: the split tensor-core GEMVs reduce inside a cluster (``launch.cluster``; the same).

    ``config``: ``(BN, BB, num_warps[, MODE[, SPLIT[, STAGES]]])`` (MODE 3: LOOKAHEAD in place of
    STAGES), default :func:`decode_config`."""
    from .launch.split import SplitScratch  # kernels load lazily
    from .legacy.gemv import gemv_legacy
    from .q4_k.gemv import gemv_q4p
    from .q5_k.gemv import gemv_q5k
    from .q6_k.gemv import gemv_q6k
    from .q6_k.gemv_i8 import gemv_i8

    qt = QT(qtype)
    config = config or decode_config(qt, n, k, role)
    bn, bb, warps, *rest = config
    mode = rest[0] if rest else 0
    deq = mode == 1
    split = rest[1] if len(rest) > 1 else decode_config(qt, n, k, role)[4]
    stages = rest[2] if len(rest) > 2 else 3  # Triton's num_stages (software pipelining of the loop)
    scratch = SplitScratch(n, bn, 1 if cluster and mode == 3 else split)  # a cluster's splits need none
    prefetch = prefetch_lines(n, k) if pdl else 0
    if mode == 3:
        if qt not in INT8:
            raise ValueError(f"the tensor-core GEMV covers q4_K and q6_K, not {qt.name}")
        from .q4_k.gemv_mma import gemv_q4p_mma  # Gluon: CUDA only
        from .q6_k.gemv_mma import gemv_q6k_mma

        tiles = bn // (16 * warps)
        ahead = bool(rest[2]) if len(rest) > 2 else False
        early, regs = mma_early(role), mma_max_regs(qt, n)
        if qt == QT.Q4_K:
            def run(x, res, norm, swiglu, xq=None, glu=False):
                return gemv_q4p_mma(x, data, bias, tiles, bb, warps, split, scratch, res, norm, swiglu, pdl,
                                    lookahead=ahead, xq=xq, glu=glu, cluster=cluster, early=early,
                                    max_regs=regs)
        else:
            evict = q6k_evict_first(n)

            def run(x, res, norm, swiglu, xq=None):
                return gemv_q6k_mma(x, data, bias, tiles, bb, warps, split, scratch, res, norm, swiglu, pdl, xq=xq,
                                    evict_first=evict, cluster=cluster, lookahead=ahead, early=early)
    elif mode == 2:
        if qt not in INT8:
            raise ValueError(f"int8-dot GEMV covers q4_K and q6_K, not {qt.name}")
        if qt == QT.Q6_K:
            def run(x, res, norm, swiglu):
                return gemv_i8(x, data, bias, bn, bb, warps, split, scratch, res, norm, swiglu, stages,
                                          pdl, prefetch)
        else:
            def run(x, res, norm, swiglu):
                return gemv_q4p(x, data, bias, bn, bb, warps, True, split, scratch, res, norm, swiglu,
                                             stages, pdl, prefetch)
    elif qt == QT.Q4_K:
        def run(x, res, norm, swiglu):
            return gemv_q4p(x, data, bias, bn, bb, warps, False, split, scratch, res, norm, swiglu,
                                         pdl=pdl, prefetch=prefetch)
    elif qt == QT.Q5_K:
        def run(x, res, norm, swiglu):
            return gemv_q5k(x, data, bias, bn, bb, warps, deq, split, scratch, res, pdl, prefetch,
                                        swiglu)
    elif qt == QT.Q6_K:
        def run(x, res, norm, swiglu):
            return gemv_q6k(x, data, bias, bn, bb, warps, deq, split, scratch, res, pdl, prefetch,
                                        swiglu)
    else:
        name = qt.name.lower()

        def run(x, res, norm, swiglu):
            return gemv_legacy(x, data, name, bias, bn, bb, warps, split, scratch, res, pdl, prefetch,
                                           swiglu)

    fused = fuses(config, bias, writes_glu(qt, config, n, bias, role))
    reads = reads_forms(config)

    def fn(x: torch.Tensor, residual: Optional[torch.Tensor] = None, norm: Optional[tuple] = None,
           swiglu: bool = False, forms: Optional[dict] = None, glu_out: bool = False):
        if x.dtype != torch.float32 or x.stride(-1) != 1:
            x = x.float().contiguous()
        if norm is not None and "rmsnorm" not in fused:
            raise ValueError("this GEMV does not fuse RMSNorm (see fn.fuses)")
        if norm is not None and swiglu:
            raise ValueError("a GEMV applies RMSNorm or SwiGLU to x, not both")
        if glu_out and ("glu_out" not in fused or residual is not None):
            raise ValueError("this GEMV does not write silu(g) * u (see fn.fuses), nor with a residual")
        res = residual if "residual" in fused else None
        res = None if res is None else res.float().contiguous()
        name = GLU_FORM if swiglu else FORM
        xq = (forms or {}).get(name) if norm is None and name in reads else None
        if glu_out:
            y, form = run(x, res, norm, swiglu, glu=True)
            return Activation(y, forms={GLU_FORM: form})
        if xq is not None:  # x already quantized (and SwiGLU applied): the kernel reads the form alone
            y = run(x, res, None, False, xq=xq)
        else:
            y = run(x, res, norm, swiglu)
        return y if residual is None or res is not None else y + residual

    fn.scratch = scratch  # split-K buffers (tests check the counters return to zero)
    fn.fuses = fused
    fn.reads = reads
    return fn


def decode_candidates(weight: Weight, ctx) -> list[Candidate]:
    """The GEMV for this weight's type, or ``[]`` when the type is not covered.

    The offer depends on the type only. With the bytes loaded, the decode plane is built now;
    when the core only plans (``weight.raw`` is None) it would be built at the first call.
    """
    try:
        qt = QT(weight.qtype)
    except ValueError:
        return []
    block = 256 if qt in KQUANTS else 32
    if qt not in SERVED or weight.n_in % block:
        return []
    label = f"mmq.gemv.{qt.name.lower()}"
    config = decode_config(qt, weight.n_out, weight.n_in, weight.role, mma_enabled(ctx))
    fused = fuses(config, weight.bias, writes_glu(qt, config, weight.n_out, weight.bias, weight.role))
    pdl = pdl_enabled(ctx)
    raw = qt == QT.Q5_K  # the only type whose GEMV reads the GGUF bytes at run time
    has_plane = planes.KEY_DECODE in weight.planes or (qt == QT.Q4_K and planes.KEY_Q4K in weight.planes)
    if weight.raw is None and (raw or not has_plane):
        state: dict = {}

        def lazy(x: torch.Tensor, **kw) -> torch.Tensor:
            if "fn" not in state:
                if weight.raw is None and (raw or not has_plane):
                    raise RuntimeError(f"{label}: {weight.name} has neither raw blocks nor a decode plane")
                state["fn"] = make_gemv(qt, prepare(weight), weight.bias, weight.n_out, weight.n_in, config,
                                        role=weight.role, pdl=pdl, cluster=pdl)
            return state["fn"](x, **kw)

        return [Candidate(PLUGIN, label, lazy, fuses=fused, reads=reads_forms(config))]
    fn = make_gemv(qt, prepare(weight), weight.bias, weight.n_out, weight.n_in, config, role=weight.role,
                   pdl=pdl, cluster=pdl)  # clusters: compute capability 9.0+, as PDL, and off with it
    return [Candidate(PLUGIN, label, fn, fuses=fused, reads=fn.reads, reads_raw=raw)]


def group_candidates(weights: list[Weight], ctx) -> list[Candidate]:
    """One tensor-core launch for a q4_K and a q6_K weight of the same width (``pair_mma``: a Q4_K_M
    layer's q|k and v), RMSNorm fused: ``fn(x, norm=None) -> [y4, y6]`` (views of one buffer)."""
    if len(weights) != 2 or not mma_enabled(ctx):
        return []
    w4, w6 = weights
    try:
        types = (QT(w4.qtype), QT(w6.qtype))
    except ValueError:
        return []
    k = w4.n_in
    if types != (QT.Q4_K, QT.Q6_K) or w6.n_in != k or k % 256:
        return []
    bn, spans, warps, _, split, ahead = mma_config(QT.Q4_K, w4.n_out, k)
    if bn != 16 * PAIR_Q6K[0] * warps:
        return []
    from .launch.split import SplitScratch

    pdl = pdl_enabled(ctx)
    scratch = [SplitScratch(w.n_out, bn, 1 if pdl else split) for w in weights]  # a cluster's splits need none
    tiling4, evict6 = (bn // (16 * warps), spans, ahead), q6k_evict_first(w6.n_out)
    # the planes now, as for the members' own candidates; planned without the bytes, at the first call
    state = {"planes": [prepare(w) for w in weights]} if all(w.raw is not None for w in weights) else {}

    def fn(x: torch.Tensor, norm: Optional[tuple] = None) -> list[torch.Tensor]:
        from .pair_mma import gemv_pair_mma  # Gluon: CUDA only

        if "planes" not in state:
            if any(w.raw is None and planes.KEY_DECODE not in w.planes and planes.KEY_Q4K not in w.planes
                   for w in weights):
                raise RuntimeError(f"mmq.gemv_pair: {w4.name} / {w6.name} have neither raw blocks nor planes")
            state["planes"] = [prepare(w) for w in weights]
        if x.dtype != torch.float32 or x.stride(-1) != 1:
            x = x.float().contiguous()
        p4, p6 = state["planes"]
        y = gemv_pair_mma(x, p4, w4.bias, p6, w6.bias, tiling4, PAIR_Q6K, warps, split, *scratch, norm, pdl,
                          evict6=evict6, cluster=pdl, early=mma_early(w4.role))
        return [y[:, :w4.n_out], y[:, w4.n_out:]]

    return [Candidate(PLUGIN, "mmq.gemv_pair.q4_k+q6_k", fn, fuses=("rmsnorm",))]
