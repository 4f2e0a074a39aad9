"""The q4_K / q6_K warpgroup-MMA GEMM (``prefill.gemm_wgmma``; Gluon, Hopper only) against gguf's dequantized
weights (tolerance of the bf16 GEMMs, ``test_mmq_gemm``), and its batch invariance: a row's bits are
the same alone or among others, wherever it sits, for every split."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

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
