"""Capture ``step(token_ids, positions)`` once per input shape as a CUDA graph; replay per token.

Two steps are wrapped this way: the decode step (one token at ``positions``) and the prefill step
(a prompt padded to a bucket length, ``positions`` being the row whose logits it returns).

The first call with a new shape/dtype key (after ``capture_after`` eager calls) warms the step
up on a side stream (Triton compiles, lazily built planes and caches appear outside the capture),
captures one call into a graph, then replays it. Later calls copy the inputs into the graph's static buffers, replay, and return the
graph's static logits: the returned tensor is overwritten by the next call (read or copy it
first; the engine samples from it before stepping again).

Keys hold shapes, dtypes and the device only: never a gate or environment value. If capture
fails the step runs eagerly from then on for that key, and one line goes to stderr.

Warm-up and capture run the step on the very inputs of that first call. A decode step writes the
KV cache at ``positions`` and reads up to it, and a prefill step writes and reads rows from 0, so
running either again on the same inputs is harmless.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from minfer_core.weights import Candidate

PLUGIN = "cuda_graphs"
LABEL = "graph.decode"
PREFILL_LABEL = "graph.prefill"
WARMUP = 2


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class GraphedStep:
    """A step that replays CUDA graphs (one per input key), eager where capture failed."""

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device, warmup: int = WARMUP,
                 capture_after: int = 0, what: str = "decode"):
        self.step = step
        self.device = torch.device(device)
        self.warmup = warmup
        self.capture_after = capture_after  # eager calls per key before capturing (a one-off shape costs nothing)
        self.what = what
        self.seen: dict[tuple, int] = {}
        self.graphs: dict[tuple, _Captured] = {}
        self.failed: dict[tuple, str] = {}
        self.pool = None  # one memory pool shared by every graph of this step

    @staticmethod
    def key(token_ids: torch.Tensor, positions: torch.Tensor) -> tuple:
        return (tuple(token_ids.shape), token_ids.dtype, tuple(positions.shape), positions.dtype)

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        key = self.key(token_ids, positions)
        cap = self.graphs.get(key)
        if cap is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if key in self.failed or self.seen[key] <= self.capture_after:
                return self.step(token_ids, positions)
            cap = self._capture(key, token_ids, positions)
            if cap is None:
                return self.step(token_ids, positions)
        cap.tokens.copy_(token_ids, non_blocking=True)
        cap.positions.copy_(positions, non_blocking=True)
        cap.graph.replay()
        return cap.logits

    def _capture(self, key: tuple, token_ids: torch.Tensor, positions: torch.Tensor) -> Optional[_Captured]:
        tokens = token_ids.to(self.device).clone()
        pos = positions.to(self.device).clone()
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        try:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step(tokens, pos)
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.step(tokens, pos)
            if not isinstance(logits, torch.Tensor):
                raise TypeError(f"the step returned {type(logits).__name__}, not a tensor")
        except Exception as e:  # any capture problem: eager from now on, said once
            torch.cuda.synchronize(self.device)
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.failed[key] = why
            print(f"[minfer cuda_graphs] capture failed, {self.what} runs eagerly: {why}", file=sys.stderr, flush=True)
            return None
        self.pool = graph.pool()
        cap = _Captured(graph, tokens, pos, logits)
        self.graphs[key] = cap
        return cap


class StepCandidate(Candidate):
    """A :class:`Candidate` that is also the wrapped step itself (``candidate(tokens, positions)``).

    The hook specification asks for a callable; the candidate form carries the plugin name and
    the label ``graph.decode`` for ``minfer gates`` and traces.
    """

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.fn(token_ids, positions)


def graphed_step(step: Callable, device) -> StepCandidate:
    return StepCandidate(PLUGIN, LABEL, GraphedStep(step, device))


def graphed_prefill(step: Callable, device) -> StepCandidate:
    """The prefill step: captured at the second prompt of a bucket length (the first runs eagerly
    and is the warm-up), one warm-up on the capture stream, then replayed."""
    return StepCandidate(PLUGIN, PREFILL_LABEL, GraphedStep(step, device, warmup=1, capture_after=1, what="prefill"))
