"""Token sampling with llama.cpp's knobs: repeat penalty, top-k, top-p, min-p, temperature.

Sampling runs on the CPU in float32 with a seeded ``torch.Generator`` so a seed reproduces a run
on any device. Nothing sorts the vocabulary: top-k takes the k best, top-p ranks only as many
tokens as its mass needs, and the draw is one uniform number against the kept tokens' running sum.
``temp == 0`` is greedy (argmax, no randomness). ``repeat_last_n`` is llama.cpp's: 0 turns the
penalty off, -1 looks back over the whole history.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

import torch


@dataclass
class SamplerConfig:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: Optional[int] = None

    def __post_init__(self):
        """The same ranges the CLI's --flags accept (minfer_core/commands/values.py)."""
        finite = all(math.isfinite(x) for x in (self.temp, self.top_p, self.min_p, self.repeat_penalty))
        if not finite:
            raise ValueError("temp, top-p, min-p and repeat-penalty must be finite numbers")
        if self.temp < 0:
            raise ValueError("temp must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError("top-k must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top-p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min-p must be in [0, 1]")
        if self.repeat_penalty <= 0:
            raise ValueError("repeat-penalty must be > 0")
        if self.repeat_last_n < -1:
            raise ValueError("repeat-last-n must be >= -1 (-1 = the whole context, 0 = off)")
        if self.seed is not None and not -1 <= self.seed < 2**64:
            raise ValueError("seed must be -1 (random) or in [0, 2**64)")

    @property
    def greedy(self) -> bool:
        return self.temp == 0


#: SamplerConfig fields a model file may set defaults for, and their GGUF keys (llama.cpp reads the
#: same keys: a user's flag wins, then the file's value, then the built-in default)
FILE_KEYS = {"temp": "general.sampling.temp", "top_k": "general.sampling.top_k",
             "top_p": "general.sampling.top_p", "min_p": "general.sampling.min_p",
             "repeat_penalty": "general.sampling.penalty_repeat",
             "repeat_last_n": "general.sampling.penalty_last_n"}


def file_defaults(metadata: dict) -> tuple[dict, list[str]]:
    """The sampling defaults a model file's metadata sets (``general.sampling.*``): the valid ones as
    SamplerConfig fields, and a line for each value refused (a wrong type, or out of range)."""
    found, refused = {}, []
    for field, key in FILE_KEYS.items():
        if key not in metadata:
            continue
        v = metadata[key]
        want_int = field in ("top_k", "repeat_last_n")
        ok = isinstance(v, int) if want_int else isinstance(v, (int, float))
        try:
            if not ok or isinstance(v, bool):
                raise ValueError(f"not {'an integer' if want_int else 'a number'}")
            SamplerConfig(**{field: v})  # the same ranges as the flags
        except (ValueError, TypeError, OverflowError) as e:
            refused.append(f"{key} = {v!r:.40} ignored: {e}")
            continue
        found[field] = v
    return found, refused


class Sampler:
    def __init__(self, cfg: SamplerConfig):
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None and cfg.seed >= 0 else random.randrange(2**31)
        self.gen = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        """Pick the next token from ``logits`` (vocab,) given the tokens so far."""
        c = self.cfg
        if c.repeat_penalty != 1.0 and history and c.repeat_last_n != 0:
            logits = logits.clone()
            window = history if c.repeat_last_n < 0 else history[-c.repeat_last_n:]
            recent = torch.tensor(sorted(set(window)), device=logits.device)
            sel = logits[recent]
            logits[recent] = torch.where(sel > 0, sel / c.repeat_penalty, sel * c.repeat_penalty)
        if c.greedy:
            return int(torch.argmax(logits))
        x = logits.float().cpu()
        if c.top_k > 0:  # the k best, best first
            vals, idx = torch.topk(x, min(c.top_k, x.numel()))
        else:  # every token, in vocabulary order (only top-p needs an order, and ranks what it keeps)
            vals, idx = x, None
        best = vals.max()
        if not torch.isfinite(best):  # e.g. every logit penalized to -inf: nothing to weigh
            return int(torch.argmax(x))
        if c.min_p > 0.0 or c.top_p < 1.0:
            w = torch.exp(vals - best)  # probabilities at temperature 1, times their sum
            mass = c.top_p * float(w.sum())  # top-p's share of what top-k left
        if c.min_p > 0.0:  # p >= min_p * p_max (what it drops ranks below all it keeps)
            keep = w >= c.min_p
            vals, w = vals[keep], w[keep]
            idx = keep.nonzero().squeeze(1) if idx is None else idx[keep]
        if c.top_p < 1.0:  # the most probable tokens until their mass reaches top_p (the last one included)
            vals, w, idx = _nucleus(vals, w, idx, mass)
        # float64 and relative to the best: a tiny temperature sharpens to the argmax, never overflows to nan
        p = torch.exp((vals.double() - float(best)) / c.temp)
        cdf = torch.cumsum(p, 0)
        u = torch.rand((), generator=self.gen, dtype=torch.float64) * cdf[-1]
        j = min(int(torch.searchsorted(cdf, u, right=True)), cdf.numel() - 1)
        return j if idx is None else int(idx[j])


def _nucleus(vals: torch.Tensor, w: torch.Tensor, idx: Optional[torch.Tensor], mass: float):
    """The candidates (``vals``, weights ``w``, token ids ``idx``; None: positions are the ids) of the
    largest weights, best first, whose running sum reaches ``mass``, the one that crosses it included:
    sorted only as far as needed (the best 64, then 1,024 when they can hold it, then all)."""
    n, k = w.numel(), 64
    while True:
        top, pos = torch.topk(w, k) if k < n else torch.sort(w, descending=True)
        before = torch.cumsum(top, 0) - top
        if k >= n or before[-1] >= mass:
            break
        # the best 1,024 weigh at most these 64 plus 960 more of the 64th's weight: skip them when short
        k = 1024 if k == 64 and float(before[-1] + top[-1]) + 960 * float(top[-1]) >= mass else n
    keep = before < mass
    pos = pos[keep]
    return vals[pos], top[keep], pos if idx is None else idx[pos]
