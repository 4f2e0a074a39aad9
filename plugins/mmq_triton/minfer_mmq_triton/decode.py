"""Decode matmuls (fewer than 16 activation rows): quantized GEMVs, one per GGUF type.

``decode_candidates(weight, ctx)`` is what ``plugin.py`` returns from
``minfer_matmul_candidates(weight, "decode", ctx)``. Each candidate's ``fn(x)`` takes float32
``(M, K)`` (M = 1 .. 15) and returns float32 ``(M, N) = x @ W.T + bias``; it reads no gate, no
environment and nothing on the host, so a decode step that calls it can be captured as a CUDA
graph. Labels: ``mmq.gemv.<type>`` (e.g. ``mmq.gemv.q4_k``).

Data read: q4_K from its plane (``planes.Q4KPlane``, exact; the prefill's own plane when
registration built it, else built here), q5_K from ``weight.raw``, every other type from its
decode plane (``gemv_pack``, built here once and kept in ``weight.planes[gemv_pack.KEY]``, the
same bytes as the raw blocks). The q4_K plane holds the same values whoever built it, so which
prefill planes exist never changes a decode result. No decode kernel but q5_K's reads raw bytes
(``Candidate.reads_raw``), so the core can release them.

Kernels: float GEMVs (``gemv_kquant``, ``gemv_legacy``, ``gemv_q4plane``; ~1e-7 of
``sum |x w|``) for every type, and int8 dot products over a two-digit int8 copy of x (~1e-5;
``gemv_q8dot`` for q6_K, ``gemv_q4plane`` for q4_K) for weights of 16 MiB or more and for the
weights fed by an RMSNorm (qkv, gate|up, output head), whose norm the quantizer applies. Short, wide matrices split the row over several programs
(``gemv_split``, deterministic). :func:`decode_config` holds the measured choices.

Fused pieces (``Candidate.fuses``, keyword arguments of ``fn``): every GEMV of a weight without a
bias adds ``residual=`` in its epilogue; every GEMV takes ``swiglu=True`` (x is ``[g | u]``), done
by the kernel that quantizes x (int8) or as the float kernels load x (``gemv_prologue``); the
int8 GEMVs also take ``norm=(w, eps)`` (RMSNorm of x), applied by their quantizing kernel.

On CUDA (compute capability 8.0+) the q4_K and q6_K weights that take the int8 path run on tensor
cores instead (``gemv_mma``, MODE 3: same two-digit x, same exact integer sub-block sums; H200, runs
29-30: the 7B's gate|up 36.8 -> 25.6 us, q4_K ffn_down 23.5 -> 17.2 us, qkv 10.0 -> 8.2 us, q6_K
ffn_down 27.5 -> 26.4 us, output head 143.6 -> 140.6 us; tg128 377 -> 445 tok/s);
``MINFER_DECODE_MMA=0`` keeps the dp4a kernels (A/B runs, debugging), read once per load like
``MINFER_PDL``.

On compute capability 9.0+ the kernels launch with programmatic dependent launch (``pdl``), decided
once per load from the load context (``MINFER_PDL=0`` turns it off); it changes when a kernel starts,
never what it computes.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.weights import Candidate, Weight

from . import gemv_pack, planes
from .pdl import enabled as pdl_enabled, prefetch_lines

PLUGIN = "mmq_triton"
MAX_ROWS = 15

#: Kernel configs ``(BN rows per program, BB blocks per step, num_warps, MODE)``; MODE 0: float
#: kernels summing per sub-block, 1: float kernels dequantizing with one FMA, 2: int8 dot products
#: (q4_K / q6_K only; it adds one small launch that quantizes x), 3: the same on tensor cores (q4_K /
#: q6_K, CUDA only; BB counts q4_K's 128-value spans or q6_K's blocks). The values are
#: the winners of the H200 sweeps (plugins/mmq_triton/tests/test_decode_bench.py --sweep,
#: benchmarks/sweep_gemv.py and, under PDL, benchmarks/sweep_small.py; results in benchmarks/results/,
#: 2026-11-30) at the 7B / 0.5B shapes.
KQUANT_FLOAT = (8, 2, 4, 0)  # num_warps 2 when a step is a single super-block (BB = 1)
KQUANT_INT8 = {QT.Q4_K: (8, 4, 4, 2), QT.Q6_K: (16, 2, 2, 2)}
#: q4_K reads its plane (``gemv_q4plane``): a step is BB 128-value spans, not super-blocks.
#: Long rows (K >= 8192, ffn_down) and small matrices (under INT8_MIN_BYTES) have their own tiles.
#: Narrow matrices (under Q4K_NARROW_BELOW rows: the 7B's k, the 0.5B's ffn_down) take 8-span steps,
#: masked, split 4 ways (0.5B ffn_down 7.3 -> 5.7 us under PDL, run20-sweep-small.txt).
Q4K_FLOAT, Q4K_FLOAT_NARROW, Q4K_FLOAT_SPLIT, Q4K_NARROW_BELOW = (8, 4, 4, 0), (8, 8, 4, 0), 4, 2048
Q4K_INT8_LONG, Q4K_INT8_SMALL = (16, 2, 2, 2), (8, 16, 4, 2)
INT8_MAX_SPLIT = {QT.Q4_K: 8, QT.Q6_K: 4}
INT8_MIN_BYTES = 16 << 20  # below this the extra launch costs more than the dot products save
#: MODE 3 (``gemv_mma``): 4 warps a program, each one 16-row tile (q6_K ffn_down: two); tall matrices
#: (gate|up, the output head) take 2 spans / blocks a step (q4_K gate|up with the next step requested
#: before each step's arithmetic), the others q4_K 4 spans, q6_K 2 blocks, split-K until the grid has
#: about MMA_PROGRAMS programs (at most 8 splits). From ``benchmarks/sweep_mma.py`` on the H200
#: (run 29 q4_K, run 30 ``--q6``).
MMA_WARPS, MMA_TALL, MMA_PROGRAMS = 4, 16384, 640
LEGACY_SMALL, LEGACY_MID, LEGACY_BIG = (8, 4, 2, 0), (16, 4, 4, 0), (32, 4, 4, 0)
#: Rows of up to LEGACY_ONE_STEP blocks (K <= 1024) under 64 MiB: one step covers the whole row (4 or 8
#: rows a program), so no program waits for memory twice. Under PDL on the H200 the 0.5B's shapes
#: gain 1.3-4 us a GEMV against the tiles above (benchmarks/results/run20-sweep-small.txt).
LEGACY_ONE_STEP = 32
#: Split-K (``gemv_split``) for grids of fewer than SPLIT_BELOW programs, while the grid stays
#: under TARGET_PROGRAMS and each split keeps MIN_STEPS steps (MIN_STEPS_TINY under 2 MiB, where
#: latency dominates): short, wide matrices then fill the GPU.
SPLIT_BELOW = 512
TARGET_PROGRAMS = 4096
MIN_STEPS, MIN_STEPS_TINY = 2.0, 1.5

SUPPORTED = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
KQUANTS = (QT.Q4_K, QT.Q5_K, QT.Q6_K)


def _pow2_divisor(nb: int, cap: int) -> int:
    """The largest power of two <= cap dividing nb, or cap when that is under cap / 4 (masked tail)."""
    bb = 1
    while bb * 2 <= cap and nb % (bb * 2) == 0:
        bb *= 2
    return bb if bb * 4 >= cap or nb < cap else cap


def auto_split(n: int, nb: int, bn: int, bb: int, nbytes: int = 0) -> int:
    """Splits of the row so that short, wide matrices still fill the GPU (see gemv_split)."""
    blocks, steps, split = -(-n // bn), -(-nb // bb), 1
    if blocks >= SPLIT_BELOW:
        return 1
    min_steps = MIN_STEPS_TINY if nbytes < (2 << 20) else MIN_STEPS
    while blocks * split * 2 <= TARGET_PROGRAMS and steps / (split * 2) >= min_steps:
        split *= 2
    return split


#: Roles whose input is an RMSNorm output: there the int8 path's quantizing launch replaces the
#: norm's own launch, so it pays at any size (other weights need INT8_MIN_BYTES; 7B tg128 377 against
#: 370 tok/s with the float GEMVs and one RMSNorm launch for the qkv, run 20).
INT8_NORM_ROLES: tuple[str, ...] = ("qkv", "gate_up", "output")


def mma_config(qt, n: int) -> tuple[int, ...]:
    """MODE 3's ``(BN, BB, num_warps, 3, SPLIT, LOOKAHEAD)`` for a q4_K (BB: spans) or q6_K (BB:
    blocks) weight of ``n`` rows."""
    if n >= MMA_TALL:
        return 16 * MMA_WARPS, 2, MMA_WARPS, 3, 1, int(qt == QT.Q4_K)
    bn = 16 * MMA_WARPS * (2 if qt == QT.Q6_K else 1)
    split, blocks = 1, -(-n // bn)
    while split < 8 and blocks * split * 2 <= MMA_PROGRAMS:
        split *= 2
    return bn, 4 if qt == QT.Q4_K else 2, MMA_WARPS, 3, split, 0


def decode_config(qtype, n: int, k: int, role: str = "", mma: bool = False) -> tuple[int, ...]:
    """``(BN, BB, num_warps, MODE, SPLIT)`` for a weight of ``n`` rows and ``k`` columns; ``mma``: the
    tensor-core GEMV is available (see :func:`mma_enabled`; its configs add LOOKAHEAD)."""
    from minfer_core.quants import info

    qt = QT(qtype)
    nbytes = n * info(qt).row_bytes(k)
    max_split = 64
    if qt in KQUANTS:
        nb = k // (128 if qt == QT.Q4_K else 256)
        if qt in KQUANT_INT8 and (nbytes >= INT8_MIN_BYTES or role in INT8_NORM_ROLES):
            bn, cap, warps, mode = KQUANT_INT8[qt]
            if qt == QT.Q4_K and k >= 8192:
                bn, cap, warps, mode = Q4K_INT8_LONG
            elif qt == QT.Q4_K and nbytes < INT8_MIN_BYTES:
                bn, cap, warps, mode = Q4K_INT8_SMALL
            max_split = INT8_MAX_SPLIT[qt]
            if mma:
                return mma_config(qt, n)
        elif qt == QT.Q4_K:
            bn, cap, warps, mode = Q4K_FLOAT if n >= Q4K_NARROW_BELOW else Q4K_FLOAT_NARROW
        else:
            bn, cap, warps, mode = KQUANT_FLOAT
    else:
        nb = k // 32
        if nb <= LEGACY_ONE_STEP and nbytes < (64 << 20):  # the whole row in one (masked) step
            return 4 if n < 1024 else 8, 1 << (nb - 1).bit_length(), 4, 0, 1
        bn, cap, warps, mode = (LEGACY_SMALL if nbytes < (2 << 20) else
                                LEGACY_MID if nbytes < (64 << 20) else LEGACY_BIG)
    narrow = qt == QT.Q4_K and mode == 0 and n < Q4K_NARROW_BELOW
    if qt == QT.Q4_K and (mode == 2 or narrow):  # the plane kernels mask a partial last step cheaply
        bb = min(cap, 1 << (nb.bit_length() - 1))
    else:
        bb = _pow2_divisor(nb, cap)
    if qt in (QT.Q5_K, QT.Q6_K) and mode == 0 and bb == 1:
        warps = 2
    split = min(max_split, auto_split(n, nb, bn, bb, nbytes))
    if narrow:
        split = max(split, Q4K_FLOAT_SPLIT)
    return bn, bb, warps, mode, split


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


def prepare(weight: Weight):
    """The data the GEMV reads: raw rows (q5_K) or the decode plane (built once)."""
    qt = QT(weight.qtype)
    if qt == QT.Q5_K:
        return weight.raw
    plane = weight.planes.get(gemv_pack.KEY)
    if plane is None:
        if qt == QT.Q4_K:  # the prefill's plane if registration built it (same values either way)
            plane = weight.planes.get(planes.KEY_Q4K) or planes.build_q4k(weight.raw, weight.n_in)
        elif qt == QT.Q6_K:
            plane = gemv_pack.pack_q6k(weight.raw, weight.n_in)
        else:
            plane = gemv_pack.pack_legacy(weight.raw, qt, weight.n_in)
        weight.planes[gemv_pack.KEY] = plane
    return plane


def fuses(config: tuple, bias) -> tuple[str, ...]:
    """What ``fn`` fuses besides the matmul (see the module docstring) under ``config``."""
    mode = config[3] if len(config) > 3 else 0
    out = () if bias is not None else ("residual",)
    return out + (("rmsnorm", "swiglu") if mode in (2, 3) else ("swiglu",))


def make_gemv(qtype, data, bias: Optional[torch.Tensor], n: int, k: int,
              config: Optional[tuple] = None, role: str = "",
              pdl: bool = False) -> Callable[..., torch.Tensor]:
    """``fn(x (M, K) f32, residual=None, norm=None, swiglu=False) -> (M, n) f32`` over prepared
    ``data`` (see :func:`prepare`); ``fn.fuses`` says which keywords the kernels do themselves.
    ``pdl``: launch with programmatic dependent launch (``pdl``; CUDA, compute capability 9.0+).

    ``config``: ``(BN, BB, num_warps[, MODE[, SPLIT[, STAGES]]])`` (MODE 3: LOOKAHEAD in place of
    STAGES), default :func:`decode_config`."""
    from . import gemv_kquant, gemv_legacy, gemv_q4plane, gemv_q8dot, gemv_split  # kernels load lazily

    qt = QT(qtype)
    config = config or decode_config(qt, n, k, role)
    bn, bb, warps, *rest = config
    mode = rest[0] if rest else 0
    deq = mode == 1
    split = rest[1] if len(rest) > 1 else decode_config(qt, n, k, role)[4]
    stages = rest[2] if len(rest) > 2 else 3  # Triton's num_stages (software pipelining of the loop)
    scratch = gemv_split.SplitScratch(n, bn, split)
    prefetch = prefetch_lines(n, k) if pdl else 0
    if mode == 3:
        if qt not in (QT.Q4_K, QT.Q6_K):
            raise ValueError(f"the tensor-core GEMV covers q4_K and q6_K, not {qt.name}")
        from . import gemv_mma  # Gluon: CUDA only

        tiles = bn // (16 * warps)
        if qt == QT.Q4_K:
            def run(x, res, norm, swiglu):
                return gemv_mma.gemv_q4p_mma(x, data, bias, tiles, bb, warps, split, scratch, res, norm, swiglu, pdl,
                                             lookahead=bool(rest[2]) if len(rest) > 2 else False)
        else:
            def run(x, res, norm, swiglu):
                return gemv_mma.gemv_q6k_mma(x, data, bias, tiles, bb, warps, split, scratch, res, norm, swiglu, pdl)
    elif mode == 2:
        if qt not in (QT.Q4_K, QT.Q6_K):
            raise ValueError(f"int8-dot GEMV covers q4_K and q6_K, not {qt.name}")
        if qt == QT.Q6_K:
            def run(x, res, norm, swiglu):
                return gemv_q8dot.gemv_i8(x, data, bias, bn, bb, warps, split, scratch, res, norm, swiglu, stages,
                                          pdl, prefetch)
        else:
            def run(x, res, norm, swiglu):
                return gemv_q4plane.gemv_q4p(x, data, bias, bn, bb, warps, True, split, scratch, res, norm, swiglu,
                                             stages, pdl, prefetch)
    elif qt == QT.Q4_K:
        def run(x, res, norm, swiglu):
            return gemv_q4plane.gemv_q4p(x, data, bias, bn, bb, warps, False, split, scratch, res, norm, swiglu,
                                         pdl=pdl, prefetch=prefetch)
    elif qt == QT.Q5_K:
        def run(x, res, norm, swiglu):
            return gemv_kquant.gemv_q5k(x, data, bias, bn, bb, warps, deq, split, scratch, res, pdl, prefetch,
                                        swiglu)
    elif qt == QT.Q6_K:
        def run(x, res, norm, swiglu):
            return gemv_kquant.gemv_q6k(x, data, bias, bn, bb, warps, deq, split, scratch, res, pdl, prefetch,
                                        swiglu)
    else:
        name = qt.name.lower()

        def run(x, res, norm, swiglu):
            return gemv_legacy.gemv_legacy(x, data, name, bias, bn, bb, warps, split, scratch, res, pdl, prefetch,
                                           swiglu)

    fused = fuses(config, bias)

    def fn(x: torch.Tensor, residual: Optional[torch.Tensor] = None, norm: Optional[tuple] = None,
           swiglu: bool = False) -> torch.Tensor:
        if x.dtype != torch.float32 or x.stride(-1) != 1:
            x = x.float().contiguous()
        if norm is not None and "rmsnorm" not in fused:
            raise ValueError("this GEMV does not fuse RMSNorm (see fn.fuses)")
        if norm is not None and swiglu:
            raise ValueError("a GEMV applies RMSNorm or SwiGLU to x, not both")
        res = residual if "residual" in fused else None
        y = run(x, None if res is None else res.float().contiguous(), norm, swiglu)
        return y if residual is None or res is not None else y + residual

    fn.scratch = scratch  # split-K buffers (tests check the counters return to zero)
    fn.fuses = fused
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
    if qt not in SUPPORTED or weight.n_in % block:
        return []
    label = f"mmq.gemv.{qt.name.lower()}"
    config = decode_config(qt, weight.n_out, weight.n_in, weight.role, mma_enabled(ctx))
    fused = fuses(config, weight.bias)
    pdl = pdl_enabled(ctx)
    raw = qt == QT.Q5_K  # the only type whose GEMV reads the GGUF bytes at run time
    has_plane = gemv_pack.KEY in weight.planes or (qt == QT.Q4_K and planes.KEY_Q4K in weight.planes)
    if weight.raw is None and (raw or not has_plane):
        state: dict = {}

        def lazy(x: torch.Tensor, **kw) -> torch.Tensor:
            if "fn" not in state:
                if weight.raw is None and (raw or not has_plane):
                    raise RuntimeError(f"{label}: {weight.name} has neither raw blocks nor a decode plane")
                state["fn"] = make_gemv(qt, prepare(weight), weight.bias, weight.n_out, weight.n_in, config,
                                        pdl=pdl)
            return state["fn"](x, **kw)

        return [Candidate(PLUGIN, label, lazy, fuses=fused)]
    fn = make_gemv(qt, prepare(weight), weight.bias, weight.n_out, weight.n_in, config, pdl=pdl)
    return [Candidate(PLUGIN, label, fn, fuses=fused, reads_raw=raw)]
