"""The sampler's knobs against an independent reading of them (llama.cpp's order: top-k, then top-p
and min-p on the temperature-1 probabilities of what is left, then the temperature over the kept
tokens), and its cost on a full vocabulary.

Oracle: the kept set and the distribution computed here in float64 by sorting everything, the
straightforward way the sampler avoids; draws checked against it by frequency.
"""

from __future__ import annotations

import math

import pytest
import torch

from minfer_core.sampling import Sampler, SamplerConfig, _nucleus


def expected(logits: list[float], cfg: SamplerConfig) -> dict[int, float]:
    """Token -> probability, from a full sort in float64."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if cfg.top_k > 0:
        order = order[:cfg.top_k]
    best = logits[order[0]]
    z = sum(math.exp(logits[i] - best) for i in order)
    kept, before = [], 0.0
    for i in order:
        p = math.exp(logits[i] - best) / z
        if before < cfg.top_p and p >= cfg.min_p * (1.0 / z):
            kept.append(i)
        before += p
    w = {i: math.exp((logits[i] - best) / cfg.temp) for i in kept}
    total = sum(w.values())
    return {i: v / total for i, v in w.items()}


LOGITS = [2.0, 1.5, 1.4, 0.3, -0.5, -1.0, -4.0, 0.9]
CONFIGS = [SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
           SamplerConfig(temp=0.7, top_k=0, top_p=0.8, min_p=0.0),
           SamplerConfig(temp=1.3, top_k=5, top_p=1.0, min_p=0.0),
           SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.2),
           SamplerConfig(temp=2.0, top_k=6, top_p=0.9, min_p=0.1),
           # top-p's mass is of what top-k left, not of what min-p keeps: token 7 stays (0.768 < 0.8)
           SamplerConfig(temp=1.0, top_k=0, top_p=0.8, min_p=0.3)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"t{c.temp}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
def test_draws_follow_the_filtered_distribution(cfg):
    want = expected(LOGITS, cfg)
    cfg.seed = 7
    s, n = Sampler(cfg), 20000
    counts: dict[int, int] = {}
    x = torch.tensor(LOGITS)
    for _ in range(n):
        t = s(x)
        counts[t] = counts.get(t, 0) + 1
    assert set(counts) == set(want), "drew a token the filters drop, or never drew a kept one"
    for t, p in want.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[t] - n * p) < 5 * sigma + 1, f"token {t}: {counts[t]} draws, expected {n * p:.0f}"


@pytest.mark.parametrize("spread", [0.5, 3.0, 30.0])  # nucleus of thousands / hundreds / a few tokens
def test_nucleus_equals_a_full_sort(spread):
    g = torch.Generator().manual_seed(int(spread * 10))
    vals = torch.randn(50000, generator=g) * spread
    w = torch.exp(vals - vals.max())
    for top_p in (0.3, 0.9, 0.99):
        mass = top_p * float(w.sum())
        got_vals, got_w, got_idx = _nucleus(vals, w, None, mass)
        top, pos = torch.sort(w, descending=True)
        keep = (torch.cumsum(top, 0) - top) < mass
        assert torch.equal(got_idx, pos[keep]) and torch.equal(got_w, top[keep])
        assert torch.equal(got_vals, vals[pos[keep]])


def test_same_seed_same_draws_and_positions_map_to_token_ids():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(151936, generator=g) * 2
    for cfg in (SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5),
                SamplerConfig(temp=0.8, top_k=0, top_p=0.9, min_p=0.05, seed=5),
                SamplerConfig(temp=0.8, top_k=40, seed=5)):
        a, b = Sampler(cfg), Sampler(cfg)
        draws = [a(x) for _ in range(50)]
        assert draws == [b(x) for _ in range(50)]
        kept = set(expected(x.tolist(), cfg)) if cfg.top_k or cfg.min_p else None
        if kept is not None:  # every draw is a token the filters keep (ids, not positions among them)
            assert set(draws) <= kept
