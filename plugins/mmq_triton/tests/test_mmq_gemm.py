"""Prefill matmuls against gguf's dequantizer + a float64 GEMM, for every served type.

Tolerance: activations and weights are rounded to bfloat16 (8 significant bits) and products are
summed in float32, so each term carries a relative error of ~2^-8 with random sign; the result's
Frobenius error relative to ||ref|| stays near 2^-8 / sqrt(2) ~ 3e-3 regardless of K. Bounds:
Frobenius 1e-2, max |y - ref| <= 2e-2 * max |ref|. Raw-block expansion is checked on its own
against the oracle with the bf16 storage bounds of test_mmq_planes (6e-3 / 1e-2).
The CPU interpreter runs tiny shapes; ``-m cuda`` runs the real layouts at M up to 3314.
"""

import itertools

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from mmq_synth import oracle, rel_err

SERVED = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]
KQ = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _weight(qt, n, k, seed=0, bias=True):
    from minfer_core.weights import Weight
    from minfer_mmq_triton.synth import random_raw

    raw = random_raw(qt, n, k, DEV, seed)
    b = torch.randn(n, device=DEV) if bias else None
    return Weight(f"t.{qt.name}", qt, (n, k), raw, "o", b)


def _check(y, x, w, n, dtype=torch.float32):
    ref = x.double().cpu() @ oracle(w.raw, w.qtype, w.n_in).double().T
    if w.bias is not None:
        ref += w.bias.double().cpu()
    assert y.shape == (x.shape[0], n) and y.dtype == dtype
    fro, mx = rel_err(y.float(), ref)
    assert fro < 1e-2 and mx < 2e-2, (fro, mx)


@pytest.mark.parametrize("qt", SERVED)
def test_dequant_raw_kernel(qt):
    from minfer_mmq_triton.prefill.dequant_raw import dequant_raw

    n, k = 24, 512 if qt in KQ else 288  # 288 = 9 legacy blocks: a partial 256-value tile
    w = _weight(qt, n, k, seed=11)
    out = torch.full((n, k), float("nan"), dtype=torch.bfloat16, device=DEV)
    dequant_raw(w.raw, qt, k, out)
    fro, mx = rel_err(out, oracle(w.raw, qt, k))
    assert fro < 6e-3 and mx < 1e-2, (fro, mx)


def _candidate(w, ctx):
    from minfer_mmq_triton import routes

    routes.register(w, ctx)
    (c,) = routes.prefill_candidates(w, ctx)
    return c


@pytest.mark.parametrize("qt", SERVED)
@pytest.mark.parametrize("m", [16, 17])
def test_prefill_candidate_small(qt, m, make_ctx):
    from minfer_core.weights import Activation

    n, k = 40, 512 if qt in KQ else 288
    w = _weight(qt, n, k, seed=m)
    c = _candidate(w, make_ctx())
    x = torch.randn(m, k, device=DEV)
    _check(c.fn(Activation(x)), x, w, n)
    _check(c.fn(Activation(x, x.to(torch.bfloat16))), x, w, n)
    _check(c.fn(Activation(None, x.to(torch.bfloat16))), x, w, n)  # fuse mode 2: plane only


@pytest.mark.parametrize("qt", SERVED)
@pytest.mark.parametrize("m", [17, 130])
def test_prefill_candidate_adds_the_residual(qt, m, make_ctx):
    """Every prefill candidate says it fuses the residual and returns ``r + x @ W.T`` for a given
    float32 ``r``, within the oracle's tolerance of the product alone once ``r`` is taken away."""
    from minfer_core.weights import Activation

    n, k = 40, 512 if qt in KQ else 288
    w = _weight(qt, n, k, seed=m + 1)
    c = _candidate(w, make_ctx())
    assert "residual" in c.fuses
    x = torch.randn(m, k, device=DEV)
    r = torch.randn(m, n, device=DEV) * 4
    y = c.fn(Activation(x, x.to(torch.bfloat16)), residual=r.clone())  # the kernel may write the sum over r
    assert y.shape == (m, n) and not torch.equal(y, r)
    _check(y - r, x, w, n)


@pytest.mark.cuda
def test_cublas_product_writes_the_sum_over_the_residual():
    """The expand route's GEMM (``scratch.product``) adds a residual it is given up in cuBLAS's epilogue
    over the residual itself (no copy of it into a new output first): the residual's storage comes back,
    holding the out-of-place call's bits, and the sum within bf16 GEMM error of the float64 oracle."""
    from minfer_core import linalg
    from minfer_mmq_triton.launch import scratch

    assert linalg.adds_in_place("cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(300, 512, generator=gen, device="cuda").bfloat16()
    w = torch.randn(640, 512, generator=gen, device="cuda").bfloat16()
    r = torch.randn(300, 640, generator=gen, device="cuda")
    want = torch.addmm(r, a, w.t(), out_dtype=torch.float32)
    oracle = r.double() + a.double() @ w.double().t()
    given = r.clone()
    y = scratch.product(a, w, None, residual=given)
    assert y.data_ptr() == given.data_ptr() and torch.equal(y, want)
    assert float((y.double() - oracle).abs().max()) < 1e-3 * float(oracle.abs().max())


@pytest.mark.parametrize("qt", SERVED)
@pytest.mark.parametrize("m", [17, 130])
def test_prefill_candidate_writes_bf16(qt, m, make_ctx, monkeypatch):
    """Every prefill candidate says it can hand back a bf16 product, and every route but the fused
    GEMM's (kept off here) does: the oracle's product within the same bounds (one more rounding)."""
    from minfer_core.weights import Activation
    from minfer_mmq_triton import tiles

    monkeypatch.setattr(tiles, "use_fused", lambda m, n, k: False)
    n, k = 40, 512 if qt in KQ else 288
    w = _weight(qt, n, k, seed=m + 2)
    c = _candidate(w, make_ctx())
    assert "bf16_out" in c.fuses
    x = torch.randn(m, k, device=DEV)
    _check(c.fn(Activation(x, x.to(torch.bfloat16)), out_bf16=True), x, w, n, torch.bfloat16)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
@pytest.mark.parametrize("m", [16, 17, 100])  # the fused GEMM's 16-, 32- and 128-row tiles
def test_plane_family_both_designs(qt, m, monkeypatch, make_ctx):
    """The fused GEMM and the just-in-time path agree with the oracle (forced each way)."""
    from minfer_core.weights import Activation
    from minfer_mmq_triton import tiles

    n, k = 48, 512
    w = _weight(qt, n, k, seed=2)
    c = _candidate(w, make_ctx())
    assert c.label == f"mmq.nb.{qt.name.lower()}" and c.reads == ("plane",)
    x = torch.randn(m, k, device=DEV)
    for fused in (False, True):
        monkeypatch.setattr(tiles, "use_fused", lambda m, n, k, f=fused: f)
        _check(c.fn(Activation(x)), x, w, n)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
def test_fused_split_k(qt):
    """Split-K of the fused GEMM: every split agrees with the oracle (bias added once, uneven
    shares, empty last splits), a row's bits do not depend on the rows beside it, and loading
    each q4_K span's scales a step ahead changes no bit."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_planes import gemm_fused

    n, k = 40, 1536 if qt == QT.Q4_K else 1280  # 12 / 5 spans
    w = _weight(qt, n, k, seed=5)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    x = torch.randn(19, k, device=DEV)
    a = x.to(torch.bfloat16)
    for split in (1, 2, 3, 4, 8):
        y = gemm_fused(a, plane, w.bias, (16, 16, 4, 2, split), ahead=False)
        _check(y, a.float(), w, n)
        alone = gemm_fused(a[5:6].contiguous(), plane, w.bias, (16, 16, 4, 2, split), ahead=False)
        assert torch.equal(alone[0], y[5]), split
        if qt == QT.Q4_K:
            assert torch.equal(gemm_fused(a, plane, w.bias, (16, 16, 4, 2, split), ahead=True), y), split


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
def test_fused_swapped_operands(qt):
    """The fused GEMM with the weight tile as the MMA's A operand and the rows as its N: within the
    oracle's bounds at several tiles and splits, q4_K decoded in float32 and in bf16x2 (GPU), and a
    row's bits independent of the rows beside it. On the GPU unswapped too: at (16, 128) the
    compiler gives a bf16x2 pack bytes of different rows."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill.gemm_planes import gemm_fused

    n, k = 40, 1024 if qt == QT.Q4_K else 768
    w = _weight(qt, n, k, seed=6)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    a = torch.randn(19, k, device=DEV).to(torch.bfloat16)
    cfgs = ((16, 16, 4, 2, 1), (16, 32, 4, 2, 3), (32, 16, 4, 2, 2), (16, 128, 4, 3, 1))
    for cfg, packed, swap in itertools.product(cfgs, (False, True), (True, False) if DEV == "cuda" else (True,)):
        y = gemm_fused(a, plane, w.bias, cfg, swap=swap, packed=packed)
        _check(y, a.float(), w, n)
        alone = gemm_fused(a[5:6].contiguous(), plane, w.bias, cfg, swap=swap, packed=packed)
        assert torch.equal(alone[0], y[5]), (cfg, packed, swap)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
def test_default_tiles_take_their_swap(qt, monkeypatch):
    """With no config, a tall weight (the threshold lowered to this test's 40 rows) at 17 rows takes
    its bucket's swapped tile: the same bits as that tile asked for explicitly, in float32 (q4_K), and
    within the oracle's bounds; so is its q4_K decoded in bf16x2 when asked for."""
    from minfer_mmq_triton import planes, tiles
    from minfer_mmq_triton.prefill.gemm_planes import gemm_fused

    monkeypatch.setattr(tiles, "FUSED_TALL_ROWS", 32)
    n, k = 40, 512
    w = _weight(qt, n, k, seed=8)
    plane = planes.BUILDERS[qt][1](w.raw, k)
    a = torch.randn(17, k, device=DEV).to(torch.bfloat16)
    *tile, swap = tiles.fused_gemm_tile(17, qt, n)
    assert swap
    y = gemm_fused(a, plane, w.bias)
    _check(y, a.float(), w, n)
    assert torch.equal(y, gemm_fused(a, plane, w.bias, tuple(tile), swap=True))
    assert torch.equal(y, gemm_fused(a, plane, w.bias, tuple(tile), swap=True, packed=False))
    _check(gemm_fused(a, plane, w.bias, tuple(tile), swap=True, packed=True), a.float(), w, n)


def test_jit_matmul_row_chunks(monkeypatch):
    """Weights above the scratch cap are expanded and multiplied in row chunks."""
    from minfer_mmq_triton.launch import scratch
    from minfer_mmq_triton.prefill.dequant_raw import dequant_raw

    n, k, m = 40, 256, 16
    w = _weight(QT.Q8_0, n, k, seed=4)
    monkeypatch.setattr(scratch, "SCRATCH_MAX", 16 * k)  # 16 rows per chunk: 3 chunks
    x = torch.randn(m, k, device=DEV)
    y = scratch.jit_matmul(x.to(torch.bfloat16), n, k, w.bias,
                           lambda o, r0, r1: dequant_raw(w.raw, w.qtype, k, o, r0, r1))
    _check(y, x, w, n)
    r = torch.randn(m, n, device=DEV)
    y_r = scratch.jit_matmul(x.to(torch.bfloat16), n, k, w.bias,
                             lambda o, r0, r1: dequant_raw(w.raw, w.qtype, k, o, r0, r1), residual=r.clone())
    torch.testing.assert_close(y_r, y + r)


@pytest.mark.parametrize("chunked", [False, True])
def test_jit_matmul_tiles_give_each_row_its_tiles_bits(monkeypatch, chunked):
    """Over fixed tiles (one expansion for all of them, in row chunks or not): the product within
    bf16 rounding of the f64 oracle, and every tile's rows the same bits as that tile multiplied
    alone, wherever it sits among the others."""
    from minfer_mmq_triton.launch import scratch
    from minfer_mmq_triton.prefill.dequant_raw import dequant_raw

    n, k, tile = 40, 256, 16
    w = _weight(QT.Q8_0, n, k, seed=5)
    if chunked:
        monkeypatch.setattr(scratch, "SCRATCH_MAX", 16 * k)

    def fill(o, r0, r1):
        return dequant_raw(w.raw, w.qtype, k, o, r0, r1)

    x = torch.randn(3 * tile, k, device=DEV)
    a = x.to(torch.bfloat16)
    y = scratch.jit_matmul(a, n, k, w.bias, fill, tile)
    _check(y, x, w, n)
    for t in range(3):
        alone = scratch.jit_matmul(a[t * tile:(t + 1) * tile].contiguous(), n, k, w.bias, fill, tile)
        assert torch.equal(alone, y[t * tile:(t + 1) * tile]), t


@pytest.mark.cuda
@pytest.mark.parametrize("chunked", [False, True])
def test_jit_matmul_tiles_keep_their_bits_on_cublas(monkeypatch, chunked):
    """The same through cuBLAS, where a bias could ride in a GEMM's epilogue (another kernel, other
    bits): a tile alone must still take the path it takes among others."""
    if DEV != "cuda":
        pytest.skip("cuBLAS")
    test_jit_matmul_tiles_give_each_row_its_tiles_bits(monkeypatch, chunked)


@pytest.mark.cuda
@pytest.mark.parametrize("qt", SERVED)
@pytest.mark.parametrize("nk", [(1152, 896), (896, 4864), (4608, 3584), (3584, 18944)])
def test_prefill_real_layouts_cuda(qt, nk, make_ctx, monkeypatch):
    from minfer_core.weights import Activation
    from minfer_mmq_triton import tiles

    n, k = nk
    if k % 256 and qt in KQ:
        pytest.skip("K-quants need K % 256 == 0")
    if k == 18944 and qt not in (QT.Q4_K, QT.Q6_K):
        pytest.skip("the 7B down layout holds only q4_K/q6_K")
    w = _weight(qt, n, k, seed=n)
    c = _candidate(w, make_ctx())
    wd = oracle(w.raw, qt, k).double().to(DEV)
    for m in (16, 17, 100, 3314):
        x = torch.randn(m, k, device=DEV)
        ref = x.double() @ wd.T + w.bias.double()
        for fused in (False, True) if qt in (QT.Q4_K, QT.Q6_K) else (False,):
            monkeypatch.setattr(tiles, "use_fused", lambda m, n, k, f=fused: f)
            fro, mx = rel_err(c.fn(Activation(x)), ref)
            assert fro < 1e-2 and mx < 2e-2, (m, fused, fro, mx)

