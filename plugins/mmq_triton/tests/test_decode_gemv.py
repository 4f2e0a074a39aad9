"""Decode GEMVs against an oracle outside the code under test.

CPU (CI): the Triton kernels run under ``TRITON_INTERPRET=1`` at small shapes; the oracle is
``gguf.quants.dequantize`` (numpy) and a float64 product. GPU (``-m cuda``): the real 7B / 0.5B
shapes; the oracle is the core's dequantizer (bit-identical to gguf's) and a float64 product.

Tolerance: ``|y - ref| <= TOL * sum_k |x_k w_k|`` per output. The float kernels accumulate in
float32 (error ~ K^0.5 * 6e-8 of that sum) and subtract ``sum(x)`` from ``sum(v x)`` with ``v``
in [1, 2) (a few ulps more); 2e-6 is ~10x above what was measured (~1e-7). The int8-dot kernels
(MODE 2) carry x as two int8 digits per value, ``x = s (h + l/256)`` with ``s = max|x| / 127``
per 32 values, i.e. ~2^-16 of the block maximum: TOL_I8 = 5e-5 (measured up to 1.2e-5; q6_K's
``- 32 sum(x)`` offset costs a few times more than q4_K). Both are far below the 1e-3 an indexing
or scale bug produces, and far below bf16 rounding (4e-3).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the plugin, installed or not

from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from minfer_core.quants import info  # noqa: E402
from minfer_core.weights import Weight  # noqa: E402
from minfer_mmq_triton import decode, planes  # noqa: E402
from minfer_mmq_triton.legacy.plane import pack_legacy, unpack_legacy  # noqa: E402
from minfer_mmq_triton.q6_k.plane import pack_q6k, unpack_q6k  # noqa: E402

TOL = 2e-6
TOL_I8 = 5e-5
TYPES = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K)
#: byte offsets of each block's float16 fields (scales, mins)
F16_FIELDS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
              QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}


def random_raw(qtype, n: int, k: int, gen: torch.Generator, device="cpu") -> torch.Tensor:
    """Random GGUF rows ``(n, row_bytes)``: every quant bit random, finite f16 scales of both signs."""
    q = info(qtype)
    nb = k // q.block_size
    raw = torch.randint(0, 256, (n, nb, q.type_size), dtype=torch.uint8, generator=gen, device=device)
    for off in F16_FIELDS[QT(qtype)]:
        mag = torch.rand(n, nb, generator=gen, device=device) * 0.02 + 1e-3
        sign = torch.where(torch.rand(n, nb, generator=gen, device=device) < 0.5, -1.0, 1.0)
        raw[:, :, off:off + 2] = (mag * sign).half().view(torch.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * q.type_size)


def oracle_dense(raw: torch.Tensor, qtype) -> torch.Tensor:
    """float64 weights by gguf's own numpy dequantizer."""
    return torch.from_numpy(gguf_quants.dequantize(raw.cpu().numpy(), QT(qtype))).double()


def check(y: torch.Tensor, x: torch.Tensor, w64: torch.Tensor, bias) -> float:
    """Worst error over the bound ``sum |x w|``; asserts every output was written and is finite."""
    x64 = x.double().to(w64.device)
    ref = x64 @ w64.T
    if bias is not None:
        ref = ref + bias.double().to(w64.device)
    bound = x64.abs() @ w64.abs().T + 1e-30
    assert y.shape == ref.shape and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    return ((y.double().to(w64.device) - ref).abs() / bound).max().item()


def make_weight(qtype, n, k, gen, bias=False, device="cpu") -> Weight:
    raw = random_raw(qtype, n, k, gen, device)
    b = torch.randn(n, generator=gen, device=device) if bias else None
    return Weight(f"t.{QT(qtype).name}", qtype, (n, k), raw, "o", b)


# -- CPU (interpreter) ------------------------------------------------------------------------

def _small_shapes(qtype):
    big = QT(qtype) in (QT.Q4_K, QT.Q5_K, QT.Q6_K)
    # (N, K, M): N not a multiple of BN; K with an even and an odd number of blocks per step
    return [(37, 512, 1), (16, 768, 3)] if big else [(37, 256, 1), (16, 96, 2)]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_matches_gguf_dequantize(qtype):
    gen = torch.Generator().manual_seed(int(qtype))
    for i, (n, k, m) in enumerate(_small_shapes(qtype)):
        w = make_weight(qtype, n, k, gen, bias=i == 0)
        (cand,) = decode.decode_candidates(w, None)
        assert cand.plugin == "mmq_triton" and cand.label == f"mmq.gemv.{QT(qtype).name.lower()}"
        x = torch.randn(m, k, generator=gen)
        err = check(cand.fn(x), x, oracle_dense(w.raw, qtype), w.bias)
        assert err < TOL, f"{QT(qtype).name} {n}x{k} M={m}: {err:.2e}"


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q8_0], ids=lambda t: t.name)
def test_gemv_rows_are_independent_and_fifteen_rows_work(qtype):
    """M = 15 (the largest decode batch): each row equals the same row run alone."""
    gen = torch.Generator().manual_seed(7)
    k = 256 if qtype == QT.Q4_K else 64
    w = make_weight(qtype, 8, k, gen)
    (cand,) = decode.decode_candidates(w, None)
    x = torch.randn(15, k, generator=gen)
    y = cand.fn(x)
    assert check(y, x, oracle_dense(w.raw, qtype), None) < TOL
    assert torch.equal(y[4:5], cand.fn(x[4:5].clone()))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q5_0], ids=lambda t: t.name)
def test_split_k_matches_and_is_deterministic(qtype):
    """Every split count (incl. uneven and empty splits) gives the oracle's answer; repeated
    calls give identical bits and leave the arrival counters at zero (graph replay safe)."""
    gen = torch.Generator().manual_seed(5)
    big = qtype in (QT.Q4_K, QT.Q6_K)
    n, k = 24, (1536 if big else 448)
    w = make_weight(qtype, n, k, gen, bias=True)
    w64 = oracle_dense(w.raw, qtype)
    data = decode.prepare(w)
    x = torch.randn(2, k, generator=gen)
    for split in (2, 3, 4, 8):
        cfg = (8, 1 if big else 2, 4, 0, split)
        fn = decode.make_gemv(qtype, data, w.bias, n, k, cfg)
        y1 = fn(x)
        assert check(y1, x, w64, w.bias) < TOL, f"split {split}"
        assert torch.equal(fn(x), y1)
        (_, counters), = fn.scratch._bufs.values()
        assert counters.numel() == 2 * 3 and int(counters.abs().sum()) == 0


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_int8_dot_gemv_matches(qtype):
    """MODE 2 (int8 dot products): uneven splits, masked tails, two rows, bias, outlier columns."""
    gen = torch.Generator().manual_seed(9)
    n, k = 21, 1280
    w = make_weight(qtype, n, k, gen, bias=True)
    w64 = oracle_dense(w.raw, qtype)
    data = decode.prepare(w)
    x = torch.randn(2, k, generator=gen) * torch.rand(1, k, generator=gen) * 3
    x[:, 7] = 40.0  # one large value per block must not swamp its neighbours beyond TOL_I8
    for cfg in [(16, 2, 4, 2, 1), (8, 1, 2, 2, 3)]:
        fn = decode.make_gemv(qtype, data, w.bias, n, k, cfg)
        assert check(fn(x), x, w64, w.bias) < TOL_I8, cfg


@pytest.mark.parametrize("qtype,cfg", [(QT.Q4_K, (8, 1, 2, 2, 2)), (QT.Q6_K, (8, 1, 2, 2, 1)),
                                       (QT.Q4_K, (8, 2, 2, 0, 1)), (QT.Q5_0, (8, 4, 2, 0, 2)),
                                       (QT.Q6_K, (8, 1, 2, 0, 2)), (QT.Q5_K, (4, 1, 2, 1, 1)),
                                       (QT.Q8_0, (8, 4, 2, 0, 1))],
                         ids=["q4_k-i8", "q6_k-i8", "q4_k-float", "q5_0-float-split", "q6_k-float-split",
                              "q5_k-deq", "q8_0-float"])
def test_fused_residual_norm_swiglu(qtype, cfg):
    """What ``fn.fuses`` promises, against the same float64 oracle applied to the unfused input:
    ``residual + f(x) @ W.T`` with f = SwiGLU (every kernel) or RMSNorm * w (int8 GEMVs)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter in CI, the GPU there
    gen = torch.Generator().manual_seed(11)
    n, k = 19, 512
    w = make_weight(qtype, n, k, gen)
    w64 = oracle_dense(w.raw, qtype)
    w.raw = w.raw.to(dev)
    fn = decode.make_gemv(qtype, decode.prepare(w), None, n, k, cfg)
    tol = TOL_I8 if cfg[3] == 2 else TOL
    h = (torch.randn(2, k, generator=gen) * 3).to(dev)
    res = torch.randn(2, n, generator=gen).to(dev)
    assert "residual" in fn.fuses
    assert check(fn(h, residual=res) - res, h, w64, None) < tol
    assert "swiglu" in fn.fuses
    gu = (torch.randn(2, 2 * k, generator=gen) * 2).to(dev)
    g, u = gu.double().chunk(2, dim=-1)
    act = (g * torch.sigmoid(g) * u).float()
    assert check(fn(gu, swiglu=True), act, w64, None) < tol
    assert check(fn(gu, swiglu=True, residual=res) - res, act, w64, None) < tol
    if cfg[3] != 2:
        assert "rmsnorm" not in fn.fuses
        with pytest.raises(ValueError):
            fn(h, norm=(torch.ones(k, device=dev), 1e-6))
        return
    assert "rmsnorm" in fn.fuses
    with pytest.raises(ValueError):
        fn(h, norm=(torch.ones(k, device=dev), 1e-6), swiglu=True)
    nw, eps = (torch.rand(k, generator=gen) + 0.5).to(dev), 1e-6
    normed = (h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + eps) * nw.double()).float()
    assert check(fn(h, norm=(nw, eps), residual=res) - res, normed, w64, None) < tol


def test_activation_quantizer_two_digits():
    from minfer_mmq_triton.ops.quant_x import quantize_x

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 512, generator=gen) * torch.rand(3, 512, generator=gen) * 5
    x[1, 32:64] = 0.0  # an all-zero block
    xh, xl, xs, x16 = quantize_x(x)
    h = xh.view(torch.int8).float().view(3, 16, 32)
    lo = xl.view(torch.int8).float().view(3, 16, 32)
    back = (xs[:, :, None] * (h + lo / 256)).view(3, 512)
    blockmax = x.view(3, 16, 32).abs().amax(-1, keepdim=True).expand(3, 16, 32).reshape(3, 512)
    assert ((back - x).abs() <= blockmax / 127 / 400 + 1e-30).all()
    assert h.abs().max() <= 127 and lo.min() >= -128 and lo.max() <= 127
    assert torch.allclose(x16, x.view(3, 32, 16).sum(-1), rtol=1e-6, atol=1e-6)
    assert (back[1, 32:64] == 0).all()


def test_activation_quantizer_norm_over_several_programs():
    """The fused RMSNorm where a row spans several quantizer programs (K = 3,584: four programs of 1,024
    values, the last one partly past K; each sums the whole row's squares and keeps its own chunk): every
    block's digits give ``rmsnorm(x) * w`` within the rounding bound, with torch's block maxima and
    16-value sums."""
    from minfer_mmq_triton.ops.quant_x import quantize_x

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3584, generator=gen) * 3
    x[1, 3000] = 50.0
    nw = torch.rand(3584, generator=gen) + 0.5
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw
    xh, xl, xs, x16 = quantize_x(x, norm=(nw, 1e-6))
    h, lo = (t.view(torch.int8).view(2, 112, 32).float() for t in (xh, xl))
    amax = normed.view(2, 112, 32).abs().amax(-1)
    assert torch.allclose(xs * 127, amax, rtol=1e-5)
    s = (amax / 127)[:, :, None]
    assert ((s * (h + lo / 256) - normed.view(2, 112, 32)).abs() <= s / 400).all()
    assert torch.allclose(x16, normed.view(2, 224, 16).sum(-1), rtol=1e-5, atol=1e-5)


def test_activation_quantizer_rows_layout():
    """The batched GEMM's layout (``rows=True``): one scale ``s = max|x| / 127`` per 256 values,
    stored as ``s / 256`` in a (K/256, MP) table; per 8 values digit h's 8 bytes then digit l's, with
    ``x = s (h + l / 256)``; the integer sums of ``256 h + l`` per 32 values in a (K/32, MP) table.
    Checked against torch's own max, norm, sums and rounding bound."""
    from minfer_mmq_triton.ops.quant_x import quantize_x

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 512, generator=gen) * 3
    x[2, 300] = 40.0
    nw = torch.rand(512, generator=gen) + 0.5
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw
    for kw, ref in (({}, x), ({"norm": (nw, 1e-6)}, normed)):
        xq, table, sums = quantize_x(x, rows=True, **kw)
        q = xq.view(torch.int8).view(5, 64, 16)
        h, lo = q[..., :8].reshape(5, 512).float(), q[..., 8:].reshape(5, 512).float()
        amax = ref.view(5, 2, 256).abs().amax(-1)
        assert table.shape == (2, 16) and torch.allclose(table[:, :5].T * 256 * 127, amax, rtol=1e-5)
        assert sums.shape == (16, 16) and sums.dtype == torch.int32
        assert torch.equal(sums[:, :5].T.long(), (256 * h + lo).long().view(5, 16, 32).sum(-1))
        s = (amax / 127).repeat_interleave(256, dim=1)
        assert ((s * (h + lo / 256) - ref).abs() <= s / 400).all()
        assert h.abs().max() <= 127 and lo.min() >= -128 and lo.max() <= 127


def test_gemv_reads_noncontiguous_and_f16_input():
    gen = torch.Generator().manual_seed(3)
    w = make_weight(QT.Q5_0, 8, 64, gen)
    (cand,) = decode.decode_candidates(w, None)
    x = torch.randn(64, 2, generator=gen).T  # (2, 64), column stride 2
    assert check(cand.fn(x), x, oracle_dense(w.raw, QT.Q5_0), None) < TOL
    xh = x.half()
    assert check(cand.fn(xh), xh.float(), oracle_dense(w.raw, QT.Q5_0), None) < TOL


@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in (QT.Q4_K, QT.Q5_K)], ids=lambda t: t.name)
def test_decode_plane_holds_exactly_the_raw_bytes(qtype):
    gen = torch.Generator().manual_seed(11)
    k = 512
    raw = random_raw(qtype, 5, k, gen)
    if qtype == QT.Q6_K:
        plane = pack_q6k(raw, k)
        back = unpack_q6k(plane)
    else:
        plane = pack_legacy(raw, qtype, k)
        back = unpack_legacy(plane, qtype)
    assert torch.equal(back, raw)
    assert plane.nbytes() == raw.numel()


def test_candidates_only_for_covered_types():
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (4, 64 * 4), dtype=torch.uint8, generator=gen)
    assert decode.decode_candidates(Weight("f", QT.F32, (4, 64), raw), None) == []
    q2 = random_raw(QT.Q4_K, 4, 256, gen)  # bytes do not matter: the type has no GEMV
    assert decode.decode_candidates(Weight("q2", QT.Q2_K, (4, 256), q2[:, :84].contiguous()), None) == []
    planned = decode.decode_candidates(Weight("planned", QT.Q4_K, (4, 256), None), None)  # raw not loaded
    assert [c.label for c in planned] == ["mmq.gemv.q4_k"]


def test_plane_built_once_and_reused():
    gen = torch.Generator().manual_seed(1)
    w = make_weight(QT.Q6_K, 4, 256, gen)
    decode.decode_candidates(w, None)
    plane = w.planes[planes.KEY_DECODE]
    decode.decode_candidates(w, None)
    assert w.planes[planes.KEY_DECODE] is plane


# -- GPU: the real shapes -----------------------------------------------------------------------

#: (qtype, N, K) of every decode matmul in the 7B (qwen2, Q4_K_M) and 0.5B models, plus SmolLM2 q4_1
REAL_SHAPES = [
    (QT.Q4_K, 4608, 3584), (QT.Q4_K, 3584, 3584), (QT.Q4_K, 37888, 3584), (QT.Q4_K, 3584, 18944),
    (QT.Q6_K, 3584, 18944), (QT.Q6_K, 512, 3584), (QT.Q6_K, 152064, 3584),
    (QT.Q5_0, 1152, 896), (QT.Q5_0, 896, 896), (QT.Q5_0, 9728, 896), (QT.Q8_0, 128, 896),
    (QT.Q4_K, 896, 4864), (QT.Q6_K, 896, 4864), (QT.Q8_0, 151936, 896),
    (QT.Q4_1, 576, 576), (QT.Q4_1, 3072, 576), (QT.Q4_1, 576, 1536),
    (QT.Q4_0, 4096, 4096), (QT.Q5_1, 4096, 4096), (QT.Q5_K, 4096, 4096),
]


@pytest.mark.cuda
@pytest.mark.parametrize("qtype,n,k", REAL_SHAPES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_real_shapes_cuda(qtype, n, k):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = make_weight(qtype, n, k, gen, bias=n == 1152, device="cuda")
    (cand,) = decode.decode_candidates(w, None)
    w64 = dequantize(w.raw, qtype, k).double()
    tol = TOL_I8 if decode.decode_config(qtype, n, k)[3] == 2 else TOL
    for m in (1, 3):
        x = torch.randn(m, k, generator=gen, device="cuda")
        err = check(cand.fn(x), x, w64, w.bias)
        assert err < tol, f"{QT(qtype).name} {n}x{k} M={m}: {err:.2e}"


@pytest.mark.cuda
@pytest.mark.parametrize("qtype,n,k,cfg", [(QT.Q4_K, 3584, 18944, (8, 2, 2, 0, 8)), (QT.Q6_K, 3584, 18944, (4, 2, 2, 0, 4)),
                                           (QT.Q5_0, 896, 896, (8, 4, 2, 0, 4)), (QT.Q4_K, 3584, 18944, (16, 2, 4, 2, 4)),
                                           (QT.Q6_K, 3584, 18944, (16, 2, 4, 2, 4))], ids=str)
def test_split_k_replays_in_a_cuda_graph(qtype, n, k, cfg):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(1)
    w = make_weight(qtype, n, k, gen, bias=True, device="cuda")
    fn = decode.make_gemv(qtype, decode.prepare(w), w.bias, n, k, cfg)
    x = torch.randn(1, k, generator=gen, device="cuda")
    want = fn(x).clone()
    assert check(want, x, dequantize(w.raw, qtype, k).double(), w.bias) < (TOL_I8 if cfg[3] == 2 else TOL)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn(x)
    for _ in range(3):
        y.zero_()
        g.replay()
        assert torch.equal(y, want)
    (_, counters), = fn.scratch._bufs.values()
    assert int(counters.abs().sum()) == 0
