"""Token sampling with llama.cpp's knobs: repeat penalty, top-k, top-p, min-p, temperature.

Sampling runs on the CPU in float32 with a seeded ``torch.Generator`` so a seed reproduces a run
on any device. ``temp == 0`` is greedy (argmax, no randomness). ``repeat_last_n`` is llama.cpp's:
0 turns the penalty off, -1 looks back over the whole history.
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
        if c.top_k > 0:
            vals, idx = torch.topk(x, min(c.top_k, x.numel()))
        else:
            vals, idx = torch.sort(x, descending=True)
        if not torch.isfinite(vals[0]):  # e.g. every logit penalized to -inf: nothing to weigh
            return int(idx[0])
        probs = torch.softmax(vals, dim=-1)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if c.top_p < 1.0:  # smallest prefix whose mass reaches top_p
            before = torch.cumsum(probs, 0) - probs
            keep &= before < c.top_p
        if c.min_p > 0.0:
            keep &= probs >= c.min_p * probs[0]
        vals, idx = vals[keep], idx[keep]  # keeps the best: top_p > 0 and min_p <= 1
        # float64 and relative to the best: a tiny temperature sharpens to the argmax, never overflows to nan
        p = torch.softmax((vals.double() - vals[0].double()) / c.temp, dim=-1)
        return int(idx[torch.multinomial(p, 1, generator=self.gen)])
