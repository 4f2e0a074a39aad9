"""The warpgroup-MMA GEMM's staging kernel (``prefill.gemm_wgmma.stage``; plain Triton, so it also runs
under the CPU interpreter): the batched step's producers applied while staging equal staging what
torch computed for them (RMSNorm, SwiGLU), rows past M are zero, and values beyond float16's range
are clamped to it."""

from __future__ import annotations

import torch


def _dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


def test_stage_applies_the_producers_and_pads_rows():
    from minfer_mmq_triton.prefill.gemm_wgmma import stage

    gen = torch.Generator().manual_seed(0)
    m, k, rows = 3, 512, 8
    h = (torch.randn(m, k, generator=gen) * 3).to(_dev())
    nw, eps = (torch.rand(k, generator=gen) + 0.5).to(_dev()), 1e-6
    plain = stage(h, rows)
    assert plain.shape == (rows, k) and plain.dtype == torch.float16
    assert (plain[m:] == 0).all() and sorted(plain[:m].float().flatten().tolist()) == \
        sorted(h.half().float().flatten().tolist())  # a permutation of each row's values, nothing lost

    normed = (h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + eps) * nw.double()).float()
    got, want = stage(h, rows, norm=(nw, eps)).float(), stage(normed, rows).float()
    assert torch.allclose(got, want, rtol=2e-3, atol=1e-4), (got - want).abs().max()

    gu = (torch.randn(m, 2 * k, generator=gen) * 2).to(_dev())
    g, u = gu.double().chunk(2, dim=-1)
    got, want = stage(gu, rows, swiglu=True).float(), stage((g * torch.sigmoid(g) * u).float(), rows).float()
    assert torch.allclose(got, want, rtol=2e-3, atol=1e-4), (got - want).abs().max()

    big = torch.full((1, 256), 1e6, device=_dev())
    big[0, 7] = -1e6
    s = stage(big, 8)[0].float()
    assert s.max() == 65504.0 and s.min() == -65504.0 and torch.isfinite(s).all()


def test_stage_orders():
    """``perm=0`` keeps K's order; ``perm=2`` swaps values ``4 w + 1`` and ``4 w + 2`` (the warp-specialized
    GEMM's crossed q4_K decode); ``perm=1`` (PERM) is some permutation of each 64-value half span."""
    from minfer_mmq_triton.prefill.gemm_wgmma import stage

    gen = torch.Generator().manual_seed(1)
    m, k, rows = 3, 256, 4
    h = torch.randn(m, k, generator=gen).to(_dev())
    want = h.half()
    assert torch.equal(stage(h, rows, perm=0)[:m], want)
    crossed = torch.arange(k).view(-1, 4)[:, [0, 2, 1, 3]].flatten()
    assert torch.equal(stage(h, rows, perm=2)[:m], want[:, crossed.to(h.device)])
    halves = stage(h, rows, perm=1)[:m].view(m, -1, 64)
    assert torch.equal(halves.float().sort(-1).values, want.view(m, -1, 64).float().sort(-1).values)
