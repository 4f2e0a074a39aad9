"""Gate-driven choices made once at load time: what registration builds and which prefill kernel
serves a weight. Gates come only from ``ctx.gates`` (resolved by the core); nothing here reads
the environment, and the callables handed out make no decisions beyond the row count.

Routes (prefill, 16 or more rows):

=========  ===========================================================  ======================
route      when                                                         label
=========  ===========================================================  ======================
(none)     ``MINFER_MMQ`` off, or a type this plugin does not serve     -
w16        ``MINFER_MMQ_RAW`` off: a bf16 copy built at registration    ``mmq.raw_off.<type>``
nb         ``MINFER_MMQ_RAW_NB`` on and q4_K, or q6_K with ``Q6K_NB``   ``mmq.nb.<type>``
           ... with its plane builder off (``Q4K_DSC``/``Q6K_EXP``)     ``mmq.nb.raw.<type>``
generic    every other served type (and q4_K/q6_K when ``nb`` is off)   ``mmq.generic.<type>``
=========  ===========================================================  ======================

``mmq.nb.raw.*`` keeps the plane family's contract (it reads the activation plane) but expands
raw blocks, decoding the packed scales in the kernel.
"""

from __future__ import annotations

from typing import Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Activation, Candidate, Gate, LoadContext, Weight

from . import planes, tiles
from .decode import wgmma_enabled
from .families import INT8, SERVED
from .launch.pdl import enabled as pdl_enabled

PLUGIN = "mmq_triton"

# -- the gates this plugin declares (hook minfer_gates; DESIGN.md, "The six gates") --------------

GATES = ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE", "MINFER_MMQ_Q6K_NB",
         "MINFER_MMQ_A_FUSE")
PLANE_BUILDERS = ("MINFER_MMQ_Q6K_EXP", "MINFER_MMQ_Q4K_DSC")
DECODE_SWITCHES = ("MINFER_DECODE_MMA", "MINFER_PDL")
FUSE_GATE = "MINFER_MMQ_A_FUSE"
#: The gates fuse modes 1 and 2 need on, as in the seed.
FUSE_REQUIRES = ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE", "MINFER_MMQ_Q6K_NB")
#: Types the registration-time plane family (``MINFER_MMQ_RAW_NB``) consumes.
PLANE_TYPES = INT8


def declared_gates() -> list[Gate]:
    """The six prefill gates, the two plane builders and the two decode switches."""
    return [
        Gate("MINFER_MMQ", True, "prefill matmuls (16 or more rows) run on mmq_triton's quantized-weight GEMMs",
             "mmq_triton offers nothing for prefill; f16_wmma serves prefill from its f16/bf16 weight cache",
             labels=("mmq.nb.", "mmq.generic.", "mmq.raw_off.")),
        Gate("MINFER_MMQ_RAW", True, "mmq kernels read GGUF blocks (or their registration-time planes) directly; "
             "no f16 copy is built", "mmq_triton builds a bf16 copy of each weight at registration and runs "
             "mmq.raw_off.<qtype> over it", labels=("mmq.nb.", "mmq.generic.")),
        Gate("MINFER_MMQ_RAW_NB", True, "q4_K (and, with MINFER_MMQ_Q6K_NB, q6_K) weights run on the plane family, "
             "which consumes planes built at registration", "no planes are built; q4_K and q6_K run on the "
             "generic family (mmq.generic.<qtype>)", labels=("mmq.nb.",)),
        Gate("MINFER_MMQ_A_TRANSPOSE", True, "each activation is converted once per producer into the plane the "
             "GEMMs read (mmq.prepass; fused producers write it themselves)", "no prepass; every consumer "
             "converts its own f32 activation", labels=("mmq.prepass", "ref.prepass")),
        Gate("MINFER_MMQ_Q6K_NB", True, "q6_K weights run on the plane family too (mmq.nb.q6_k)",
             "q6_K weights run on the generic family (mmq.generic.q6_k)", labels=("mmq.nb.q6_k", "mmq.nb.raw.q6_k")),
        Gate(FUSE_GATE, 2, "RMSNorm and SwiGLU producers write the activation plane themselves", modes={
            0: "producers are plain; the prepass writes the activation plane",
            1: "fused producers write the activation plane and the f32 activation (mmq.fuse1.*)",
            2: "fused producers write only the activation plane (mmq.fuse2.*); sound only when every consumer "
               "reads the plane, otherwise degraded to 1"}, labels=("mmq.fuse",)),
        Gate("MINFER_MMQ_Q6K_EXP", True, "registration builds the expanded q6_K plane the plane family reads "
             "(mmq.nb.q6_k)", "no q6_K plane; the plane family expands raw blocks in the kernel (mmq.nb.raw.q6_k)",
             labels=("mmq.nb.q6_k",), group="plane_builder"),
        Gate("MINFER_MMQ_Q4K_DSC", True, "registration builds the decoded-scale q4_K plane (W_dsc) the plane family "
             "reads (mmq.nb.q4_k)", "no q4_K plane; the plane family expands raw blocks, decoding the packed scales "
             "in the kernel (mmq.nb.raw.q4_k)", labels=("mmq.nb.q4_k",), group="plane_builder"),
        Gate("MINFER_DECODE_MMA", True, "q4_K / q6_K int8 decode GEMVs run on tensor cores (CUDA, cc >= 8.0, "
             "Triton with Gluon), and so do the batched step's q4_K / q6_K matmuls (mmq.rows.*) and, on Hopper, "
             "q4_K / q6_K matmuls of up to 64 rows (the warpgroup-MMA GEMM), large q4_K matmuls of up to 128 "
             "rows (its asynchronous form) and of 129 to 512 (the warp-specialized GEMM)",
             "those GEMVs stay on the dp4a kernels (the same integer sums, another float summation order); the "
             "batched step runs q4_K / q6_K over fixed row tiles, on the fused GEMM", group="decode"),
        Gate("MINFER_PDL", True, "decode kernels and the batched step's kernels launch with programmatic "
             "dependent launch, and the split tensor-core decode GEMVs as thread-block clusters (CUDA, cc >= 9.0)",
             "they launch without PDL or clusters (A/B runs, debugging)", group="decode"),
    ]


def plane_offence(w: Weight) -> Optional[str]:
    """Why this weight makes mode 2 unsound (the seed's plane-only flag cleared), or None if the
    plane family reads it."""
    qt = QT(w.qtype)
    if qt in PLANE_TYPES:
        return None
    if qt == QT.F32:
        return f"{w.name} is a 2-D F32 matmul weight, whose GEMM reads the f32 activation"
    return f"{w.name} is {qt.name}, which the plane family cannot read (only Q4_K and Q6_K)"


def fuse_proposal(weights: list[Weight], readers, ctx: LoadContext) -> tuple[int, str]:
    """The fuse mode the gates, the weight mix and the debug readers allow, and why (seed §3.1):
    mode 2 writes only the activation plane, so any weight the plane family cannot read (its
    consumer reads f32) or any f32 reader lowers it to 1, whatever was requested."""
    off = [g for g in FUSE_REQUIRES if not gate_on(ctx, g)]
    if off:
        return 0, f"{', '.join(off)} off (fused producers need the whole plane path)"
    requested = int(ctx.gates.get(FUSE_GATE, 2))
    if requested < 2:
        return requested, "" if requested else f"{FUSE_GATE} resolved to 0"
    offence = next((o for o in map(plane_offence, weights) if o), None)
    if offence:
        return 1, f"mode 2 degraded to 1: {offence}"
    if readers:
        return 1, f"mode 2 degraded to 1: {', '.join(readers)} reads the f32 activations"
    return 2, ""


_BUILDER_GATE = {QT.Q4_K: "MINFER_MMQ_Q4K_DSC", QT.Q6_K: "MINFER_MMQ_Q6K_EXP"}
#: What every prefill candidate here does itself when asked (``fn(act, residual=r, out_bf16=True)``;
#: see ``Candidate.fuses``): add the residual, and write a bf16 product (every route but the fused
#: GEMM, which returns float32).
FUSES = ("residual", "bf16_out")


def gate_on(ctx: LoadContext, name: str) -> bool:
    """A resolved on/off gate; a gate the core did not resolve counts as on (the default)."""
    return bool(ctx.gates.get(name, True))


def route(weight: Weight, ctx: LoadContext) -> Optional[str]:
    """``None``, ``"w16"``, ``"nb"`` or ``"generic"`` for this weight's prefill matmul."""
    if not gate_on(ctx, "MINFER_MMQ"):
        return None
    try:
        qt = QT(weight.qtype)
    except ValueError:
        return None
    if qt not in SERVED:
        return None
    if not gate_on(ctx, "MINFER_MMQ_RAW"):
        return "w16"
    if gate_on(ctx, "MINFER_MMQ_RAW_NB") and (
            qt == QT.Q4_K or (qt == QT.Q6_K and gate_on(ctx, "MINFER_MMQ_Q6K_NB"))):
        return "nb"
    return "generic"


def register(weight: Weight, ctx: LoadContext) -> None:
    """Build what the weight's route reads: the bf16 copy (w16) or the plane (nb, builder on)."""
    r = route(weight, ctx)
    if r is None or weight.raw is None:
        return
    qt = QT(weight.qtype)
    if r == "w16":
        weight.planes[planes.KEY_W16] = planes.build_w16(weight.raw, qt, weight.n_in)
    elif r == "nb" and gate_on(ctx, _BUILDER_GATE[qt]):
        key, build = planes.BUILDERS[qt]
        plane = build(weight.raw, weight.n_in)
        if plane is None:
            ctx.notes.append(f"mmq_triton: {weight.name}: a scale overflows float16, "
                             "its prefill reads raw blocks")
            return
        weight.planes[key] = plane  # the core drops weight.raw if no chosen kernel reads it


def prefill_candidates(weight: Weight, ctx: LoadContext) -> Optional[list[Candidate]]:
    """The one kernel this plugin offers for the weight's prefill matmul, per its route.

    The label depends on the gates alone (the core may plan without registering weights); the
    callable finds what registration built when it runs.
    """
    r = route(weight, ctx)
    if r is None:
        return None
    from minfer_core.linalg import probe
    probe(ctx.device)  # resolve the cuBLAS entry point now, not in the first forward
    qt = QT(weight.qtype)
    name = qt.name.lower()
    if r == "w16":
        return [Candidate(PLUGIN, f"mmq.raw_off.{name}", _w16_fn(weight), "MINFER_MMQ_RAW", fuses=FUSES,
                          reads_raw=planes.KEY_W16 not in weight.planes)]
    if r == "nb":
        gate = "MINFER_MMQ_Q6K_NB" if qt == QT.Q6_K else "MINFER_MMQ_RAW_NB"
        label = f"mmq.nb.{name}" if gate_on(ctx, _BUILDER_GATE[qt]) else f"mmq.nb.raw.{name}"
        built = planes.BUILDERS[qt][0] in weight.planes  # registration built the plane: no raw read
        reads = ("plane",) if gate_on(ctx, "MINFER_MMQ_A_TRANSPOSE") else ("f32",)  # off: it converts itself
        # with its plane built, up to 64 rows run the warpgroup-MMA or the fused GEMM, which expand nothing
        wgmma = wgmma_enabled(ctx)
        fn, tiled = _plane_fn(weight, pdl_enabled(ctx), wgmma)
        fuses = FUSES + (("swiglu_out",) if wgmma else ())  # the warpgroup-MMA GEMMs' GLU epilogue
        return [Candidate(PLUGIN, label, fn, gate, reads, fuses, reads_raw=not built, small_tiles=built, tiled=tiled)]
    fn, tiled = _raw_fn(weight)
    return [Candidate(PLUGIN, f"mmq.generic.{name}", fn, "MINFER_MMQ", ("f32",), FUSES, tiled=tiled)]


def producer_candidates(kind: str, ctx: LoadContext) -> Optional[list[Candidate]]:
    """Fused RMSNorm/SwiGLU for fuse modes 1 and 2; the prepass when ``A_TRANSPOSE`` is on."""
    if not gate_on(ctx, "MINFER_MMQ") or not gate_on(ctx, "MINFER_MMQ_A_TRANSPOSE"):
        return None
    from .ops import producers
    if kind == "prepass":
        return [Candidate(PLUGIN, "mmq.prepass", producers.prepass, "MINFER_MMQ_A_TRANSPOSE")]
    mode = int(ctx.fuse_mode)
    if mode not in (1, 2):
        return None
    write_f32, pdl = mode == 1, pdl_enabled(ctx)
    if kind == "rmsnorm":
        def fn(x, w, eps):
            return producers.rmsnorm(x, w, eps, write_f32, pdl)
    elif kind == "swiglu":
        def fn(gu):
            return producers.swiglu(gu, write_f32, pdl)
    else:
        return None
    return [Candidate(PLUGIN, f"mmq.fuse{mode}.{kind}", fn, "MINFER_MMQ_A_FUSE")]


# -- the callables ------------------------------------------------------------------------------

def _w16_fn(weight: Weight):
    from .launch.scratch import bf16_rows, product

    def fn(act: Activation, residual=None, out_bf16: bool = False):
        return product(bf16_rows(act), weight.planes[planes.KEY_W16], weight.bias, residual, out_bf16)
    return fn


def _raw_fill(weight: Weight):
    from .prefill.dequant_raw import dequant_raw

    def fill(out, r0, r1):
        return dequant_raw(weight.raw, weight.qtype, weight.n_in, out, r0, r1)
    return fill


def _plane_fn(weight: Weight, pdl: bool = False, wgmma: bool = False):
    """Plane family: for few rows the warpgroup-MMA GEMM (under ``wgmma``, Hopper; its asynchronous
    form where ``tiles.async_route`` says, the warp-specialized GEMM where ``tiles.ws_route`` says) or
    the fused GEMM (launched with PDL under ``pdl``), else expand + cuBLAS; raw blocks when no plane
    was built (builder gate off, or a float16 overflow). Its ``tiled`` form always expands (once for
    all tiles). Asked ``swiglu_out`` (a ``[gate | up]`` weight), the warpgroup-MMA GEMMs return the
    Activation of ``silu(g) * u`` from their GLU epilogue; the other routes return the product."""
    from .prefill import gemm_planes
    from .launch.scratch import bf16_rows, jit_matmul
    n, k = weight.n_out, weight.n_in
    qt = QT(weight.qtype)
    key = planes.BUILDERS[qt][0]
    raw_fill = _raw_fill(weight)

    def fill():
        plane = weight.planes.get(key)
        if plane is None:
            return raw_fill
        return lambda out, r0, r1: gemm_planes.dequant_plane(plane, k, out, r0, r1)

    def tiled(act: Activation, tile: Optional[int] = None, residual=None, out_bf16: bool = False):
        return jit_matmul(bf16_rows(act), n, k, weight.bias, fill(), tile, residual, out_bf16)

    wgmma = wgmma and qt in (QT.Q4_K, QT.Q6_K)
    split = tiles.wgmma_split(n, k)

    def fn(act: Activation, residual=None, out_bf16: bool = False, swiglu_out: bool = False):
        plane = weight.planes.get(key)
        dt = torch.bfloat16 if out_bf16 else torch.float32
        glu = swiglu_out and residual is None and weight.bias is None  # the GLU epilogue: silu(g) * u
        if plane is not None and wgmma and act.rows <= tiles.WGMMA_MAX_ROWS:
            from .prefill.gemm_wgmma import gemm_wgmma
            g = glu and tiles.gemm_glu_fits(n, 64, split)
            y = gemm_wgmma(bf16_rows(act), plane, weight.bias, tiles.wgmma_rows(act.rows), split, pdl=pdl,
                           residual=residual, out_dtype=dt, glu=g)
        elif plane is not None and wgmma and tiles.async_route(qt, act.rows, n, k):
            from .prefill.gemm_wgmma_async import gemm_wgmma_async
            tile = tiles.async_tile(qt)
            s = tiles.async_split(act.rows, n, k, tile)
            g = glu and tiles.gemm_glu_fits(n, 64 * tile[1], s)
            y = gemm_wgmma_async(bf16_rows(act), plane, weight.bias, s, pdl=pdl, residual=residual, tile=tile,
                                 out_dtype=dt, glu=g)
        elif plane is not None and wgmma and tiles.ws_route(qt, act.rows, n, k):
            from .prefill.gemm_wgmma_ws import gemm_wgmma_ws
            tile = tiles.ws_tile(act.rows)
            s = tiles.ws_split(act.rows, n, k, tile)
            g = glu and tiles.gemm_glu_fits(n, 64 * tile[1], s)
            y = gemm_wgmma_ws(bf16_rows(act), plane, weight.bias, s, pdl=pdl, residual=residual, tile=tile,
                              out_dtype=dt, glu=g)
        elif plane is not None and tiles.use_fused(act.rows, n, k):
            y = gemm_planes.gemm_fused(bf16_rows(act), plane, weight.bias, pdl=pdl)
            return y if residual is None else residual + y
        else:
            return tiled(act, residual=residual, out_bf16=out_bf16)
        return Activation(None, y) if g else y
    return fn, tiled


def _raw_fn(weight: Weight):
    from .launch.scratch import bf16_rows, jit_matmul
    fill = _raw_fill(weight)

    def tiled(act: Activation, tile: Optional[int] = None, residual=None, out_bf16: bool = False):
        return jit_matmul(bf16_rows(act), weight.n_out, weight.n_in, weight.bias, fill, tile, residual, out_bf16)
    return tiled, tiled
