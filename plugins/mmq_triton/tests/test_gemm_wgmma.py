"""The q4_K / q6_K warpgroup-MMA GEMM (``prefill.gemm_wgmma``; Gluon, Hopper only) against gguf's dequantized
weights (tolerance of the bf16 GEMMs, ``test_mmq_gemm``), and its batch invariance: a row's bits are
the same alone or among others, wherever it sits, for every split."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from mmq_synth import oracle, rel_err
from test_mmq_gemm import _check, _weight

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="Hopper wgmma")]


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k,bias", [(40, 1024, True), (300, 2048, False), (4608, 3584, True),
                                      (3584, 18944, False)], ids=str)
def test_wgmma_gemm_matches_gguf(qt, n, k, bias):
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma

    w = _weight(qt, n, k, seed=n, bias=bias)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    gen = torch.Generator(device="cuda").manual_seed(k)
    for m, rows in ((1, 8), (5, 8), (19, 32), (32, 32), (40, 64)):
        a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        for split in (1, 3, 4):
            _check(gemm_wgmma(a, plane, w.bias, rows, split), a.float(), w, n)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("split", [1, 4])
def test_wgmma_gemm_rows_keep_their_bits(qt, split):
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma

    n, k = 200, 2048
    w = _weight(qt, n, k, seed=3)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    a = torch.randn(32, k, device="cuda").to(torch.bfloat16)
    y = gemm_wgmma(a, plane, w.bias, 32, split)
    for lo, hi in ((5, 6), (0, 17), (30, 32)):
        part = gemm_wgmma(a[lo:hi].contiguous(), plane, w.bias, 32, split)
        assert torch.equal(part, y[lo:hi]), (lo, hi)
    other = a.clone()
    other[:5] = torch.randn(5, k, device="cuda").to(torch.bfloat16)
    assert torch.equal(gemm_wgmma(other, plane, w.bias, 32, split)[5:], y[5:])


#: Worst error over ``sum |x w|`` of the float16 GEMM (activations and ``q (d sc) - dmin m`` rounded to
#: float16, 2^-11 each, against float64)
TOL_F16 = 2e-3


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("split", [1, 4])
def test_wgmma_gemm_prologues_and_residual(qt, split):
    """Float32 rows, RMSNorm or SwiGLU applied by the staging kernel, the residual added in the
    epilogue (split 1) or by the split reduction, against float64."""
    from test_decode_gemv import oracle_dense
    from test_decode_mma import check_prologues
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma

    n, k = 300, 2048
    w = _weight(qt, n, k, seed=7, bias=False)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    gen = torch.Generator(device="cuda").manual_seed(5)
    check_prologues(lambda x, **kw: gemm_wgmma(x, plane, None, 8, split, **kw), oracle_dense(w.raw, qt).cuda(),
                    5, gen, tol=TOL_F16)


@pytest.mark.parametrize("n,k", [(300, 2048), (4608, 3584)], ids=str)
def test_wgmma_batch_route_in_groups_of_8(n, k):
    """The batched step's route for q4_K (``batch._wgmma_fn``): 1, 8 and 11 rows (two groups), with
    the producers and the residual, against float64."""
    from test_decode_gemv import oracle_dense
    from test_decode_mma import check_prologues
    from minfer_mmq_triton import batch

    w = _weight(QT.Q4_K, n, k, seed=7, bias=False)
    w64 = oracle_dense(w.raw, QT.Q4_K).cuda()
    gen = torch.Generator(device="cuda").manual_seed(5)
    route = batch._wgmma_fn(w, pdl=False)
    for m in (1, 8, 11):
        check_prologues(route, w64, m, gen, tol=TOL_F16)


def test_wgmma_batch_route_rows_keep_their_bits():
    """A row's bits through the batched step's route are the same alone, among 7 others, and among 12
    (two groups), at any position, with its producer and residual."""
    from minfer_mmq_triton import batch

    n, k = 4608, 3584
    w = _weight(QT.Q4_K, n, k, seed=9)
    route = batch._wgmma_fn(w, pdl=False)
    gen = torch.Generator(device="cuda").manual_seed(1)
    h = torch.randn(13, k, generator=gen, device="cuda")
    res = torch.randn(13, n, generator=gen, device="cuda")
    nw = torch.rand(k, generator=gen, device="cuda") + 0.5
    full = route(h, residual=res, norm=(nw, 1e-6))
    for lo, hi in ((0, 1), (12, 13), (3, 11), (5, 13)):
        part = route(h[lo:hi].contiguous(), residual=res[lo:hi].contiguous(), norm=(nw, 1e-6))
        assert torch.equal(part, full[lo:hi]), (lo, hi)


#: (NA, WG, STAGES) tiles of the asynchronous GEMM: one and two warpgroups, 64 to 256 rows, ring depths 2 and 3
ASYNC_TILES = [(128, 1, 2), (64, 2, 3), (256, 1, 3)]


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k,bias", [(300, 2048, True), (4608, 3584, False)], ids=str)
def test_async_gemm_matches_gguf(qt, n, k, bias):
    """The asynchronous warpgroup-MMA GEMM (``prefill.gemm_wgmma_async``) over row counts that leave a
    partial activation tile, three tile shapes, split-K 1 and 3 (an uneven share of spans)."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async

    w = _weight(qt, n, k, seed=n + 1, bias=bias)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    w64 = oracle(w.raw, w.qtype, k).double().cuda()
    gen = torch.Generator(device="cuda").manual_seed(k)
    for m in (65, 200, 513):
        a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        ref = a.double() @ w64.T + (w.bias.double() if bias else 0)
        for tile in ASYNC_TILES:
            for split in (1, 3):
                fro, mx = rel_err(gemm_wgmma_async(a, plane, w.bias, split, tile=tile), ref)
                assert fro < 1e-2 and mx < 2e-2, (m, tile, split, fro, mx)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_async_gemm_rows_keep_their_bits(qt):
    """A row's bits are the same alone or among others, in any activation tile and place in it."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async

    n, k = 200, 2048
    w = _weight(qt, n, k, seed=4)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    a = torch.randn(300, k, device="cuda").to(torch.bfloat16)
    for tile in ASYNC_TILES[:2]:
        y = gemm_wgmma_async(a, plane, w.bias, 2, tile=tile)
        for lo, hi in ((5, 6), (0, 130), (250, 300)):
            assert torch.equal(gemm_wgmma_async(a[lo:hi].contiguous(), plane, w.bias, 2, tile=tile), y[lo:hi])


@pytest.mark.parametrize("split", [1, 2])
def test_async_gemm_residual(split):
    """The residual added in the epilogue (split 1) or by the split reduction, against float64."""
    from test_decode_gemv import oracle_dense
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async

    n, k = 300, 2048
    w = _weight(QT.Q4_K, n, k, seed=8, bias=False)
    plane = planes.BUILDERS[QT.Q4_K][1](w.raw, k)
    w64 = oracle_dense(w.raw, QT.Q4_K).cuda()
    a = torch.randn(150, k, device="cuda")
    res = torch.randn(150, n, device="cuda")
    y = gemm_wgmma_async(a, plane, None, split, residual=res)
    want = res.double() + a.double() @ w64.T
    scale = (a.double().abs() @ w64.abs().T).max()
    assert ((y.double() - want).abs().max() / scale).item() < TOL_F16


#: (NA, WG, STAGES, P, REGS) tiles of the warp-specialized GEMM: the routed ones (``tiles.WS_TILE``,
#: ``tiles.WS_SMALL_TILE``), then 256 and 128 activation rows, one and two MMA warpgroups, 4 and 8 decode
#: warps, ring depths 3 to 5
WS_TILES = [(256, 1, 5, 8, 96), (128, 1, 5, 8, 96), (256, 2, 4, 4, 168), (128, 2, 4, 8, 128), (128, 1, 3, 4, 168)]


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
@pytest.mark.parametrize("n,k,bias", [(300, 2048, True), (4608, 3584, False)], ids=str)
def test_ws_gemm_matches_gguf(qt, n, k, bias):
    """The warp-specialized GEMM (``prefill.gemm_wgmma_ws``) over row counts that leave a partial
    activation tile and a partial weight tile (300 rows), four tiles, split-K 1 and 3."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws

    w = _weight(qt, n, k, seed=n + 2, bias=bias)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    w64 = oracle(w.raw, w.qtype, k).double().cuda()
    gen = torch.Generator(device="cuda").manual_seed(k + 1)
    for m in (65, 200, 513):
        a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        ref = a.double() @ w64.T + (w.bias.double() if bias else 0)
        for tile in WS_TILES:
            for split in (1, 3):
                fro, mx = rel_err(gemm_wgmma_ws(a, plane, w.bias, split, tile=tile), ref)
                assert fro < 1e-2 and mx < 2e-2, (m, tile, split, fro, mx)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_ws_gemm_rows_keep_their_bits(qt):
    """A row's bits are the same alone or among others, in any activation tile and place in it."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws

    n, k = 200, 2048
    w = _weight(qt, n, k, seed=5)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    a = torch.randn(300, k, device="cuda").to(torch.bfloat16)
    for tile in WS_TILES[:2]:
        y = gemm_wgmma_ws(a, plane, w.bias, 2, tile=tile)
        for lo, hi in ((5, 6), (0, 130), (250, 300)):
            assert torch.equal(gemm_wgmma_ws(a[lo:hi].contiguous(), plane, w.bias, 2, tile=tile), y[lo:hi])


@pytest.mark.parametrize("split", [1, 2])
def test_ws_gemm_residual(split):
    """The residual added in the epilogue (split 1) or by the split reduction, against float64."""
    from test_decode_gemv import oracle_dense
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws

    n, k = 300, 2048
    w = _weight(QT.Q4_K, n, k, seed=9, bias=False)
    plane = planes.BUILDERS[QT.Q4_K][1](w.raw, k)
    w64 = oracle_dense(w.raw, QT.Q4_K).cuda()
    a = torch.randn(150, k, device="cuda")
    res = torch.randn(150, n, device="cuda")
    y = gemm_wgmma_ws(a, plane, None, split, residual=res)
    want = res.double() + a.double() @ w64.T
    scale = (a.double().abs() @ w64.abs().T).max()
    assert ((y.double() - want).abs().max() / scale).item() < TOL_F16


@pytest.mark.parametrize("split", [1, 2])
def test_gemms_write_bf16_products(split):
    """With ``out_dtype=bf16`` each warpgroup-MMA GEMM writes exactly its float32 product rounded to
    bf16 (the epilogue's store, or the split reduction's)."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma
    from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async
    from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws

    n, k = 300, 2048
    w = _weight(QT.Q4_K, n, k, seed=10)
    plane = planes.BUILDERS[QT.Q4_K][1](w.raw, k)
    for m, gemm in ((40, lambda a, **kw: gemm_wgmma(a, plane, w.bias, 64, split, **kw)),
                    (100, lambda a, **kw: gemm_wgmma_async(a, plane, w.bias, split, **kw)),
                    (300, lambda a, **kw: gemm_wgmma_ws(a, plane, w.bias, split, **kw))):
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = gemm(a, out_dtype=torch.bfloat16)
        assert y.dtype == torch.bfloat16 and torch.equal(y, gemm(a).to(torch.bfloat16)), m


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_gemms_write_the_swiglu_of_a_gate_up_weight(qt):
    """``glu=True`` on a ``[gate | up]`` weight: each warpgroup-MMA GEMM (one and two warpgroups a tile)
    returns ``silu(g) * u`` (bf16, ``(M, N / 2)``) against float64 from gguf's dequantized weights,
    matches the SwiGLU of its own float32 product within bf16 rounding, and a row's bits do not depend
    on the other rows."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma
    from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async
    from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws

    f, k = 192, 2048
    w = _weight(qt, 2 * f, k, seed=12, bias=False)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    w64 = oracle(w.raw, w.qtype, k).double().cuda()
    gemms = [(40, lambda a, **kw: gemm_wgmma(a, plane, None, 64, 1, **kw))]
    if qt == QT.Q4_K:  # the asynchronous GEMM's route is q4_K's
        gemms += [(100, lambda a, **kw: gemm_wgmma_async(a, plane, None, 1, **kw)),
                  (100, lambda a, **kw: gemm_wgmma_async(a, plane, None, 1, tile=(128, 2, 3), **kw))]
    gemms += [(300, lambda a, t=t, **kw: gemm_wgmma_ws(a, plane, None, 1, tile=t, **kw)) for t in WS_TILES]
    gen = torch.Generator(device="cuda").manual_seed(13)
    for m, gemm in gemms:
        a = torch.randn(m, k, generator=gen, device="cuda").to(torch.bfloat16)
        y = gemm(a, glu=True)
        assert y.shape == (m, f) and y.dtype == torch.bfloat16
        g, u = (a.double() @ w64.T).chunk(2, dim=-1)
        fro, mx = rel_err(y.float(), g * torch.sigmoid(g) * u)
        assert fro < 1e-2 and mx < 2e-2, (m, fro, mx)
        g, u = gemm(a).chunk(2, dim=-1)
        own = g * torch.sigmoid(g) * u
        assert ((y.float() - own).abs() <= own.abs() * 2 ** -8 + 1e-6 * own.abs().max()).all(), m
        for lo, hi in ((3, 4), (m - 37, m)):
            assert torch.equal(gemm(a[lo:hi].contiguous(), glu=True), y[lo:hi]), (m, lo, hi)
