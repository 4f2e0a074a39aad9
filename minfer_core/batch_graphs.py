"""Decode-only batched steps replayed from CUDA graphs, one graph per bucket of entries.

``step(inputs) -> logits`` is :func:`minfer_core.batch_forward.decode_rows` bound to a model: a
packed int64 device tensor ``(E, width)`` in, logits ``(E, vocab)`` out, nothing read on the host.
A bucket is captured the first time a step of that size comes: two warm-up runs on a side stream
(Triton compiles, lazily built planes and scratch appear outside the capture), then the capture,
all on padding inputs (every entry on the scratch block), so capturing never touches a real
sequence's K/V. A replay copies the step's inputs (padding rows included, so no row of an earlier,
larger step survives) into the graph's static buffer and returns the graph's static logits,
overwritten by the next replay of any bucket (every graph shares one memory pool): read them
before the next step. If a capture fails, that bucket runs eagerly from then on (one line to
stderr).
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch

MAX_GRAPH_ENTRIES = 256  # larger decode steps run eagerly


class DecodeGraphs:
    def __init__(self, step: Callable[[torch.Tensor], torch.Tensor], padding: torch.Tensor, device, warmup: int = 2):
        self.step = step
        self.padding = padding  # (width,) int64: one padding entry
        self.device = torch.device(device)
        self.warmup = warmup
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.failed: dict[int, str] = {}
        self.pool = None

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """Logits (E, vocab) of a packed step ``inputs`` (E, width) on the device."""
        e = inputs.shape[0]
        cap = self.graphs.get(e)
        if cap is None and e <= MAX_GRAPH_ENTRIES and e not in self.failed:
            cap = self._capture(e)
        if cap is None:
            return self.step(inputs)
        graph, static, logits = cap
        static.copy_(inputs)
        graph.replay()
        return logits

    def _capture(self, e: int) -> Optional[tuple]:
        static = self.padding.to(self.device).expand(e, -1).contiguous()
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        try:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step(static)
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.step(static)
        except Exception as e_:  # any capture problem: this bucket runs eagerly, said once
            torch.cuda.synchronize(self.device)
            why = f"{type(e_).__name__}: {str(e_).splitlines()[0] if str(e_) else ''}"
            self.failed[e] = why
            print(f"[minfer] batched decode graph of {e} entries not captured, it runs eagerly: {why}",
                  file=sys.stderr, flush=True)
            return None
        self.pool = graph.pool()
        self.graphs[e] = (graph, static, logits)
        return self.graphs[e]
