"""Capture a step once per input key as a CUDA graph; replay it for every later call of that key.

Three steps are wrapped this way: the decode step ``step(token_ids, positions)`` (one token at
``positions``), the prefill step ``step(token_ids, last)`` (a prompt padded to a bucket length,
``last`` the row whose logits it returns), and the batched engine's decode-only step
``step(inputs)`` (one packed row per sequence, a graph per entry count: :class:`BatchGraphs`).

The first call with a new key (after ``capture_after`` eager calls) warms the step up on a side
stream (Triton compiles, lazily built planes and caches appear outside the capture), captures one
call into a graph, then replays it. Every graph of a step shares one memory pool. Later calls
copy the inputs into the graph's static buffers, replay, and return the graph's static logits:
the returned tensor is overwritten by the next call (read or copy it first; the engines sample
from it before stepping again).

Keys hold shapes, dtypes and the device only: never a gate or environment value. If capture
fails the step runs eagerly from then on for that key, and one line goes to stderr.

Warm-up and capture run the step on the very inputs of that first call (the batched step: on
padding entries, see :class:`BatchGraphs`). A decode step writes the KV cache at ``positions``
and reads up to it, and a prefill step writes and reads rows from 0, so running either again on
the same inputs is harmless.
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
BATCH_LABEL = "graph.batch"
WARMUP = 2
MAX_GRAPH_ENTRIES = 256  # larger batched steps run eagerly


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # the static inputs the graph reads
    logits: torch.Tensor  # the static output it writes


class GraphedStep:
    """A step that replays CUDA graphs (one per input key), eager where capture failed."""

    def __init__(self, step: Callable[..., torch.Tensor], device, warmup: int = WARMUP, capture_after: int = 0,
                 what: str = "decode"):
        self.step = step
        self.device = torch.device(device)
        self.warmup = warmup
        self.capture_after = capture_after  # eager calls per key before capturing (a one-off shape costs nothing)
        self.what = what
        self.seen: dict = {}
        self.graphs: dict = {}  # key -> _Captured
        self.failed: dict = {}  # key -> why its capture failed
        self.pool = None  # one memory pool shared by every graph of this step

    def key(self, *inputs: torch.Tensor):
        """Shapes and dtypes of the inputs."""
        return tuple(v for x in inputs for v in (tuple(x.shape), x.dtype))

    def capturable(self, key) -> bool:
        return True

    def static_inputs(self, key, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The buffers the graph is captured on (copies of the first call's inputs)."""
        return tuple(x.to(self.device).clone() for x in inputs)

    def describe(self, key) -> str:
        return self.what

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = self.key(*inputs)
        cap = self.graphs.get(key)
        if cap is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if key in self.failed or self.seen[key] <= self.capture_after or not self.capturable(key):
                return self.step(*inputs)
            cap = self._capture(key, inputs)
            if cap is None:
                return self.step(*inputs)
        for static, x in zip(cap.inputs, inputs):
            static.copy_(x, non_blocking=True)
        cap.graph.replay()
        return cap.logits

    def _capture(self, key, inputs: tuple[torch.Tensor, ...]) -> Optional[_Captured]:
        static = self.static_inputs(key, inputs)
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        try:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step(*static)
            main.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self.step(*static)
            if not isinstance(logits, torch.Tensor):
                raise TypeError(f"the step returned {type(logits).__name__}, not a tensor")
        except Exception as e:  # any capture problem: eager from now on for this key, said once
            torch.cuda.synchronize(self.device)
            _end_rng_capture(self.device)
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.failed[key] = why
            print(f"[minfer cuda_graphs] capture failed, {self.describe(key)} runs eagerly: {why}",
                  file=sys.stderr, flush=True)
            return None
        self.pool = graph.pool()
        cap = _Captured(graph, static, logits)
        self.graphs[key] = cap
        return cap


def _end_rng_capture(device) -> None:
    """After a failed capture: torch ends a capture's RNG bookkeeping only when the capture itself
    ends well, so a capture that failed inside ``torch.cuda.graph`` leaves the device's default
    generator marked as capturing, and every later random op on the device raises ("Offset increment
    outside graph capture"). One small capture that ends well ends that state too (best effort)."""
    try:
        with torch.cuda.device(device):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001  the step runs eagerly either way
        pass


class BatchGraphs(GraphedStep):
    """The batched decode-only step ``step(inputs (E, width)) -> logits (E, vocab)``: one graph per
    entry count E up to :data:`MAX_GRAPH_ENTRIES` (keyed by E), captured the first time a step of
    that size comes, on ``padding`` entries only (every entry on the scratch block), so warming up
    and capturing never touch a real sequence's K/V. A replay copies all E rows (padding included),
    so no row of an earlier step survives."""

    def __init__(self, step: Callable[[torch.Tensor], torch.Tensor], padding: torch.Tensor, device,
                 warmup: int = WARMUP):
        super().__init__(step, device, warmup=warmup, what="batched decode")
        self.padding = padding  # (width,) int64: one padding entry

    def key(self, inputs: torch.Tensor) -> int:
        return inputs.shape[0]

    def capturable(self, key: int) -> bool:
        return key <= MAX_GRAPH_ENTRIES

    def static_inputs(self, key: int, inputs) -> tuple[torch.Tensor]:
        return (self.padding.to(self.device).expand(key, -1).contiguous(),)

    def describe(self, key: int) -> str:
        return f"batched decode of {key} entries"


class StepCandidate(Candidate):
    """A :class:`Candidate` that is also the wrapped step itself (``candidate(*inputs)``).

    The hook specifications ask for a callable; the candidate form carries the plugin name and
    the label (``graph.decode``, ``graph.prefill``, ``graph.batch``) for ``minfer gates`` and traces.
    """

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.fn(*inputs)


def graphed_step(step: Callable, device) -> StepCandidate:
    return StepCandidate(PLUGIN, LABEL, GraphedStep(step, device))


def graphed_prefill(step: Callable, device) -> StepCandidate:
    """The prefill step: captured at the second prompt of a bucket length (the first runs eagerly
    and is the warm-up), one warm-up on the capture stream, then replayed."""
    return StepCandidate(PLUGIN, PREFILL_LABEL, GraphedStep(step, device, warmup=1, capture_after=1, what="prefill"))


def graphed_batch(step: Callable, padding: torch.Tensor, device) -> StepCandidate:
    """The batched decode-only step: a graph per entry count, captured on padding entries."""
    return StepCandidate(PLUGIN, BATCH_LABEL, BatchGraphs(step, padding, device))
