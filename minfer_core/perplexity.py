"""Perplexity the way llama-perplexity computes it.

The text is tokenized once, cut into windows of ``n_ctx`` tokens (the first replaced by BOS when
the model adds one) and each window is evaluated from an empty cache. Only the second half of each
window is scored, so every scored token sees at least ``n_ctx/2`` tokens of context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .engine import Engine


@dataclass
class PerplexityResult:
    ppl: float
    err: float
    n_windows: int
    n_scored: int
    running: list[float]  # estimate after each window, as llama-perplexity prints it


def perplexity(engine: Engine, text: str, n_ctx: int, max_windows: int = -1,
               on_window: Optional[Callable[[int, float], None]] = None) -> PerplexityResult:
    tok = engine.tok
    ids = tok.encode(text, add_special=True, parse_special=False)
    n_windows = len(ids) // n_ctx
    if max_windows > 0:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"need at least {n_ctx} tokens for -c {n_ctx}, the text has {len(ids)}")
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running = []
    for w in range(n_windows):
        window = ids[w * n_ctx:(w + 1) * n_ctx]
        if tok.add_bos and tok.bos_id is not None:
            window = [tok.bos_id] + window[1:]
        engine.reset()
        logits = engine.prefill(window, all_logits=True).float()
        logp = torch.log_softmax(logits[first:n_ctx - 1], dim=-1)
        target = torch.tensor(window[first + 1:n_ctx], device=logp.device)
        token_nll = -logp.gather(1, target[:, None])[:, 0].double().cpu()
        nll += float(token_nll.sum())
        nll2 += float((token_nll ** 2).sum())
        count += token_nll.numel()
        running.append(math.exp(nll / count))
        if on_window:
            on_window(w + 1, running[-1])
    engine.reset()
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, err, n_windows, count, running)
