"""Sampling on the device (minfer_core.device_sampler) against the same float64 oracle as the host
sampler's tests (a full sort reading llama.cpp's order), its batch invariance, and the rows it
leaves to the host."""

from __future__ import annotations

import math

import pytest
import torch

from minfer_core.device_sampler import TILE, row_key, sample_rows
from minfer_core.sampling import SamplerConfig

from test_sampling import CONFIGS, LOGITS, expected

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU run checks the same on the device


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"t{c.temp}-k{c.top_k}-p{c.top_p}-m{c.min_p}")
def test_draws_follow_the_filtered_distribution(cfg):
    want, n = expected(LOGITS, cfg), 8000
    x = torch.tensor(LOGITS, device=DEV).expand(n, -1)
    got = sample_rows(x, [cfg] * n, [row_key(7, i) for i in range(n)])
    counts: dict[int, int] = {}
    for t in got:
        counts[t] = counts.get(t, 0) + 1
    assert set(counts) == set(want), "drew a token the filters drop, or never drew a kept one"
    for t, p in want.items():
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(counts[t] - n * p) < 5 * sigma + 1, f"token {t}: {counts[t]} draws, expected {n * p:.0f}"


def vocab_rows(n: int, seed: int, spread: float = 2.0) -> torch.Tensor:
    return (torch.randn(n, 151936, generator=torch.Generator().manual_seed(seed)) * spread).to(DEV)


def test_a_row_draws_the_same_alone_or_among_others():
    cfgs = [SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0), SamplerConfig(temp=0.8),
            SamplerConfig(temp=1.2, top_k=0, top_p=0.95, min_p=0.05)]
    x = vocab_rows(TILE + 5, 1)
    x[:, :50] += 12.0  # peaked: every nucleus closes within the candidates
    keys = [row_key(3, i) for i in range(x.shape[0])]
    for cfg in cfgs:
        together = sample_rows(x, [cfg] * x.shape[0], keys)
        assert None not in together
        for i in (0, 7, TILE, TILE + 4):  # first and middle of a full tile, rows of the padded one
            assert sample_rows(x[i:i + 1], [cfg], keys[i:i + 1]) == [together[i]], (cfg, i)
    # the same seed and draw number repeat a draw; another draw number gives other noise
    cfg = cfgs[0]
    again = [sample_rows(x[:1], [cfg], [row_key(3, 0)])[0] for _ in range(2)]
    other = {sample_rows(x[:1], [cfg], [row_key(3, d)])[0] for d in range(1, 40)}
    assert again[0] == again[1] and len(other) > 1


def test_rows_the_candidates_cannot_hold_go_to_the_host():
    flat = vocab_rows(2, 2, spread=3.0)  # a 0.9 nucleus of tens of thousands of tokens
    peaked = flat.clone()
    peaked[:, :10] += 30.0
    top_p = SamplerConfig(temp=1.0, top_k=0, top_p=0.9, min_p=0.0)
    assert sample_rows(flat, [top_p] * 2, [1, 2]) == [None, None]
    assert None not in sample_rows(peaked, [top_p] * 2, [1, 2])
    assert sample_rows(peaked[:1], [SamplerConfig(temp=1.0, top_k=5000, top_p=1.0, min_p=0.0)], [1]) == [None]
    # no filter at all: the whole vocabulary is drawn from on the device
    assert None not in sample_rows(flat, [SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0)] * 2, [1, 2])


def test_a_tiny_temperature_draws_the_argmax():
    x = vocab_rows(3, 4)
    got = sample_rows(x, [SamplerConfig(temp=1e-4, top_k=0, top_p=1.0, min_p=0.0)] * 3, [5, 6, 7])
    assert got == x.argmax(1).tolist()


@pytest.mark.cuda
def test_draws_on_the_gpu_match_the_cpus():
    """The same rows and keys give the same tokens on the GPU as on the CPU (peaked rows, server and
    CLI knobs): the hashed noise is integer arithmetic, and no kept set sits on a rounding edge."""
    x = vocab_rows(40, 9)
    x[:, :30] += 8.0
    keys = [row_key(11, i) for i in range(40)]
    for cfg in (SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0), SamplerConfig(temp=0.8)):
        assert sample_rows(x.cuda(), [cfg] * 40, keys) == sample_rows(x.cpu(), [cfg] * 40, keys)
