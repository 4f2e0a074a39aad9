"""The batched prompt attention over a paged pool against plain float64 causal softmax attention
over each sequence's gathered K/V; a call's rows do not depend on the other calls."""

from __future__ import annotations

import math

import pytest
import torch

from minfer_mmq_triton.ops.paged_prefill import paged_prefill

from test_paged_attention import make_batch, rel

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_calls(spans, lens):
    """``spans``: (sequence, first position, rows) per call, rows laid out one call after another."""
    calls, r0 = [], 0
    for s, p0, nr in spans:
        assert p0 + nr <= lens[s]
        calls.append([r0, nr, p0, s])
        r0 += nr
    return torch.tensor(calls, dtype=torch.int32), r0


def oracle(q, k, v, tables, calls, page):
    out = torch.zeros(q.shape[0], q.shape[1] * q.shape[2], dtype=torch.float64)
    kf, vf = k.flatten(0, 1).cpu().double(), v.flatten(0, 1).cpu().double()
    rep = q.shape[1] // k.shape[2]
    for r0, nr, p0, s in calls.tolist():
        n = p0 + nr
        rows = torch.cat([torch.arange(b * page, b * page + page) for b in tables[s].tolist()])[:n]
        kb, vb = kf[rows].repeat_interleave(rep, 1), vf[rows].repeat_interleave(rep, 1)  # (n, H, D)
        qs = q[r0:r0 + nr].cpu().double()
        sc = torch.einsum("thd,nhd->htn", qs, kb) / math.sqrt(q.shape[2])
        mask = torch.arange(n)[None, :] <= torch.arange(nr)[:, None] + p0
        p = sc.masked_fill(~mask, float("-inf")).softmax(-1)
        out[r0:r0 + nr] = torch.einsum("htn,nhd->thd", p, vb).reshape(nr, -1)
    return out.float()


@pytest.mark.parametrize("hd", [(8, 2, 32), (4, 4, 64)])
def test_paged_prefill_matches_oracle(hd):
    h, hkv, d = hd
    lens = [150, 40, 70]
    q, k, v, tables, _ = make_batch(lens, h, hkv, d, 16, device=DEV, seed=3)
    # whole prompts, a call at an offset (after cached positions), calls longer than one q block
    calls, t = make_calls([(0, 0, 64), (1, 0, 40), (0, 64, 64), (2, 7, 63), (0, 128, 22)], lens)
    q = torch.randn(t, h, d, generator=torch.Generator().manual_seed(4)).to(DEV)
    out = torch.full((t + 3, h * d), 7.0, device=DEV)  # three rows no call owns
    got = paged_prefill(q, k, v, calls.to(DEV), tables, out, 64)
    assert got is out and torch.equal(out[t:], torch.full((3, h * d), 7.0, device=DEV))
    assert rel(out[:t].cpu(), oracle(q, k, v, tables.cpu(), calls, 16)) < 2e-3


def test_a_call_alone_equals_it_among_others():
    lens = [150, 40, 70]
    q, k, v, tables, _ = make_batch(lens, 8, 2, 32, 16, device=DEV, seed=5)
    spans = [(0, 0, 64), (1, 0, 40), (0, 64, 64), (2, 0, 64), (0, 128, 22)]
    calls, t = make_calls(spans, lens)
    q = torch.randn(t, 8, 32, generator=torch.Generator().manual_seed(6)).to(DEV)
    together = paged_prefill(q, k, v, calls.to(DEV), tables, torch.zeros(t, 256, device=DEV), 64)
    for i, (r0, nr, p0, s) in enumerate(calls.tolist()):
        one = torch.tensor([[0, nr, p0, s]], dtype=torch.int32, device=DEV)
        alone = paged_prefill(q[r0:r0 + nr].contiguous(), k, v, one, tables, torch.zeros(nr, 256, device=DEV), nr)
        assert torch.equal(alone, together[r0:r0 + nr]), i


def test_offered_as_the_paged_prefill_attention_phase():
    from minfer_mmq_triton.ops.attention import attention_candidates

    (c,) = attention_candidates("paged_prefill", None)
    assert c.label == "mmq.attn.paged_prefill" and c.fn is paged_prefill
