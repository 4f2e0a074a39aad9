"""Sampling on the device for a batched engine's sampled rows, each row's draw its own.

The knobs mean what they mean on the host (:mod:`minfer_core.sampling`, llama.cpp's order): top-k
keeps the k best; top-p and min-p weigh the temperature-1 probabilities of what top-k left (top-p's
mass taken before min-p); the temperature applies to what is kept. Here the kept set is every token
at or above one threshold per row (the least kept candidate of the best ``CANDIDATES``, or min-p's
bound), and the draw is Gumbel-max over it: ``argmax((x - max) / T + g)`` with ``g`` Gumbel noise
hashed from the request's seed, how many tokens it has drawn and the token id. That is an exact draw
from the tempered distribution of the kept tokens, with no sort of the vocabulary and no host copy of
the logits.

Batch invariance: rows run in fixed tiles of ``TILE`` (padded), so every torch kernel sees the same
shapes whatever else is sampled; a row's ops are its own (max and argmax are exact, the sums run
over fixed shapes). Rows whose nucleus does not close within the candidates (very flat
distributions) or whose top-k exceeds them come back as ``None``: the caller samples those on the
host. Which rows those are depends on each row alone.
"""

from __future__ import annotations

import torch

from .batch_inputs import upload
from .sampling import SamplerConfig

CANDIDATES = 1024
TILE = 16
_M1, _M2, _M3 = 0x9E3779B97F4A7C15 - 2**64, 0xBF58476D1CE4E5B9 - 2**64, 0x94D049BB133111EB - 2**64
_LOW34, _LOW37, _LOW33 = (1 << 34) - 1, (1 << 37) - 1, (1 << 33) - 1


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer on int64 (wrapping products, logical shifts through masks)."""
    z = (z ^ ((z >> 30) & _LOW34)) * _M2
    z = (z ^ ((z >> 27) & _LOW37)) * _M3
    return z ^ ((z >> 31) & _LOW33)


def row_key(seed: int, drawn: int) -> int:
    """The noise key of a request's draw number ``drawn`` (a signed 64-bit int)."""
    z = (seed * 0x9E3779B97F4A7C15 + drawn * 0xD1B54A32D192ED03 + 1) % 2**64
    return z - 2**64 if z >= 2**63 else z


def gumbel(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise (R, vocab) float32 from int64 row keys (R,): 24 hashed bits per token."""
    ids = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    bits = (_mix(keys[:, None] + ids[None, :] * _M1) >> 40) & ((1 << 24) - 1)
    u = (bits.float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def _tile(x: torch.Tensor, knobs: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and host flags of one tile: ``knobs`` (TILE, 4) float64 and ``keys`` (TILE,) int64 on
    ``x``'s device (see :func:`_knobs`)."""
    r, vocab = x.shape
    dev = x.device
    c = min(CANDIDATES, vocab)
    k, top_p, min_p, inv_t = knobs.T  # top_k exact in float64
    k = k.long()
    top_p, min_p, inv_t = top_p.float(), min_p.float(), inv_t.float()
    m = x.max(dim=1).values
    w = torch.exp(x - m[:, None])  # temperature-1 probabilities, times their sum
    vals, _ = torch.topk(x, c, dim=1)  # the best c, best first
    wc = torch.exp(vals - m[:, None])
    rank = torch.arange(c, device=dev)
    k_eff = torch.where((k > 0) & (k <= c), k, c)
    in_k = rank[None, :] < k_eff[:, None]
    wk = wc * in_k  # the candidates' weights, zero past top-k
    total = torch.where((k > 0) & (k <= c), wk.sum(1), w.sum(1))  # what top-k left
    mass = top_p * total
    before = torch.cumsum(wk, 1) - wk
    kept = ((before < mass[:, None]) & in_k).sum(1)  # top-k and top-p: a prefix of the best
    cut = (top_p < 1.0) | ((k > 0) & (k <= c))
    floor = torch.where(cut, vals.gather(1, (kept - 1).clamp(min=0)[:, None])[:, 0], float("-inf"))
    keep = (x >= floor[:, None]) & (w >= min_p[:, None])  # min-p: p >= min_p * p_max
    score = torch.where(keep, (x - m[:, None]) * inv_t[:, None] + gumbel(keys, vocab),
                        float("-inf"))
    token = score.argmax(dim=1)
    open_nucleus = (top_p < 1.0) & ((k == 0) | (k > c)) & (kept == c) & (before[:, -1] < mass)
    return token, open_nucleus | (k > c)


def _knobs(cfgs: list[SamplerConfig], keys: list[int], dev) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's (top_k, top_p, min_p, 1 / temperature) as float64 (R, 4) and noise key as int64
    (R,) on ``dev``, padded to whole tiles (a tile's padding rows take its first row's config and
    key 0), in one copy each that does not wait for the device (else the host would wait for the
    step's forward before every tile)."""
    rows, noise = [], []
    for t0 in range(0, len(cfgs), TILE):
        tile = cfgs[t0:t0 + TILE]
        pad = TILE - len(tile)
        rows += [[cf.top_k, cf.top_p, cf.min_p, 1.0 / cf.temp] for cf in tile + [tile[0]] * pad]
        noise += keys[t0:t0 + TILE] + [0] * pad
    return upload(torch.tensor(rows, dtype=torch.float64), dev), upload(torch.tensor(noise, dtype=torch.int64), dev)


def sample_rows(logits: torch.Tensor, cfgs: list[SamplerConfig], keys: list[int]) -> list:
    """The next token of each row of ``logits`` (n, vocab) under its config (temperature > 0) and
    noise key (:func:`row_key`), or ``None`` where the host must sample it."""
    knobs, noise = _knobs(cfgs, keys, logits.device)
    tokens, host = [], []
    for t0 in range(0, logits.shape[0], TILE):
        x = logits[t0:t0 + TILE].float()
        n = x.shape[0]
        if n < TILE:  # padding rows: copies of the first, never read
            x = torch.cat([x, x[:1].expand(TILE - n, -1)])
        t, h = _tile(x, knobs[t0:t0 + TILE], noise[t0:t0 + TILE])
        tokens.append(t[:n])
        host.append(h[:n])
    both = torch.stack([torch.cat(tokens), torch.cat(host).long()]).tolist()  # one read-back
    return [None if h else t for t, h in zip(*both)]
