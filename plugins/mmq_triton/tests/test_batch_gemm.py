"""The batched step's q4_K and q6_K tensor-core GEMMs (``q4_k.gemm_mma``, ``q6_k.gemm_mma``; Gluon, GPU
only) against gguf's dequantized weights, and their batch invariance: a row's bits are the same
alone or among others, at any row count and position, for every split.

Tolerance as ``test_decode_gemv.TOL_I8`` (x carried as two int8 digits)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from test_decode_gemv import TOL_I8, check, make_weight, oracle_dense
from test_decode_mma import check_prologues

pytestmark = pytest.mark.cuda

#: (tiles, groups, warps, split)
CONFIGS = [(1, 1, 4, 1), (1, 2, 4, 3), (2, 1, 4, 4), (1, 4, 2, 8)]


QTYPES = [QT.Q4_K, QT.Q6_K]


def _fn(w, cfg):
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.q4_k.gemm_mma import gemm_q4p_mma
    from minfer_mmq_triton.q6_k.gemm_mma import gemm_q6_mma

    gemm = gemm_q4p_mma if w.qtype == QT.Q4_K else gemm_q6_mma
    plane = decode.prepare(w)
    t, g, warps, split = cfg
    return lambda x, **kw: gemm(x, plane, w.bias, t, g, warps, split, **kw)


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n,k,bias", [(21, 1280, True), (40, 2816, False), (4608, 3584, True),
                                      (3584, 18944, False)], ids=str)
def test_batch_gemm_matches_gguf(qt, n, k, bias):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = make_weight(qt, n, k, gen, bias=bias, device="cuda")
    w64 = oracle_dense(w.raw, qt).cuda() if n * k < 1e6 else dequantize(w.raw, qt, k).double()
    for m in (1, 5, 8, 19, 64):
        x = torch.randn(m, k, generator=gen, device="cuda") * 2
        x[:, 5] = 30.0
        for cfg in CONFIGS:
            err = check(_fn(w, cfg)(x), x, w64, w.bias)
            assert err < TOL_I8, f"{qt.name} {n}x{k} M={m} {cfg}: {err:.2e}"


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
def test_batch_gemm_prologues(qt):
    gen = torch.Generator(device="cuda").manual_seed(3)
    n, k = 300, 2048
    w = make_weight(qt, n, k, gen, device="cuda")
    w64 = oracle_dense(w.raw, qt).cuda()
    for cfg in CONFIGS[:2]:
        check_prologues(_fn(w, cfg), w64, 11, gen)


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_batch_gemm_rows_are_batch_invariant(qt, cfg):
    gen = torch.Generator(device="cuda").manual_seed(5)
    n, k = 1000, 3584
    w = make_weight(qt, n, k, gen, bias=True, device="cuda")
    fn = _fn(w, cfg)
    x = torch.randn(130, k, generator=gen, device="cuda")
    res = torch.randn(130, n, generator=gen, device="cuda")
    whole = fn(x, residual=res)
    for r in (0, 7, 8, 77, 129):
        alone = fn(x[r:r + 1], residual=res[r:r + 1])
        assert torch.equal(alone[0], whole[r]), f"row {r} alone differs from row {r} of 130"
    some = fn(x[60:73], residual=res[60:73])
    assert torch.equal(some, whole[60:73])
