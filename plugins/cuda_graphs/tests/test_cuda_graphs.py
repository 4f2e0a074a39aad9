"""The cuda_graphs plugin: hook wiring (CPU) and capture/replay/fallback (GPU), for the single-stream
steps and the batched engine's decode-only step.

The oracle for replay is the same step run eagerly on the same inputs: the graph must give
bit-identical logits (same kernels, same order).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minfer_core.weights import Candidate, LoadContext  # noqa: E402
from minfer_cuda_graphs import plugin  # noqa: E402
from minfer_cuda_graphs.graph import (BATCH_LABEL, LABEL, MAX_GRAPH_ENTRIES, PREFILL_LABEL, BatchGraphs,  # noqa: E402
                                      GraphedStep, graphed_batch, graphed_prefill, graphed_step)


def _ctx(device: str) -> LoadContext:
    return LoadContext(torch.device(device), None, {"MINFER_MMQ": True})


def test_not_applicable_without_cuda():
    assert "CUDA" in plugin.minfer_applicable(_ctx("cpu"))


def test_hooks_register_with_the_core_specs():
    import pluggy

    from minfer_core import hookspecs as specs

    pm = pluggy.PluginManager(specs.PROJECT)
    pm.add_hookspecs(specs)
    pm.register(plugin, name="cuda_graphs")
    names = {h.name for h in pm.get_hookcallers(plugin)}
    assert names == {"minfer_applicable", "minfer_wrap_decode_step", "minfer_wrap_prefill_step",
                     "minfer_wrap_batch_step"}
    assert all(h.has_spec() for h in pm.get_hookcallers(plugin))


def test_wrapped_step_is_a_callable_candidate():
    c = graphed_step(lambda t, p: t, "cpu")
    assert isinstance(c, Candidate) and callable(c)
    assert (c.plugin, c.label) == ("cuda_graphs", LABEL)
    assert isinstance(c.fn, GraphedStep)
    p = graphed_prefill(lambda t, last: t, "cpu")
    assert (p.plugin, p.label, p.fn.capture_after) == ("cuda_graphs", PREFILL_LABEL, 1)
    padding = torch.tensor([0, 0, 64, 1, 4, 4])
    b = plugin.minfer_wrap_batch_step(lambda inputs: inputs, padding, _ctx("cpu"))
    assert (b.plugin, b.label) == ("cuda_graphs", BATCH_LABEL)
    assert isinstance(b.fn, BatchGraphs) and b.fn.padding is padding and MAX_GRAPH_ENTRIES == 256


def test_batch_steps_past_the_largest_graph_run_eagerly():
    """More than 256 entries: no capture is attempted (so this runs on the CPU), the step runs as is."""
    calls = []
    b = graphed_batch(lambda inputs: calls.append(inputs.shape) or inputs * 2, torch.zeros(6, dtype=torch.long), "cpu")
    x = torch.arange(300 * 6).reshape(300, 6)
    assert torch.equal(b(x), x * 2) and calls == [(300, 6)]
    assert not b.fn.graphs and not b.fn.failed


# -- GPU ------------------------------------------------------------------------------------------

class ToyStep:
    """A decode-step stand-in: embeds a token, mixes in a device-side position, writes a cache."""

    def __init__(self, vocab=1000, dim=256, n_ctx=64):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.emb = torch.randn(vocab, dim, generator=g, device="cuda")
        self.w = torch.randn(vocab, dim, generator=g, device="cuda") / dim ** 0.5
        self.cache = torch.zeros(n_ctx, dim, device="cuda")
        self.calls = 0

    def __call__(self, tokens, positions):
        self.calls += 1
        h = self.emb[tokens] * (1 + positions.float()[:, None] / 10)
        self.cache.index_copy_(0, positions.long(), h)
        ctx = self.cache.sum(0, keepdim=True)
        return torch.tanh(h + ctx) @ self.w.t()


def _ids(tok, pos):
    return (torch.tensor([tok], device="cuda"), torch.tensor([pos], device="cuda"))


@pytest.mark.cuda
def test_replay_equals_eager_and_captures_once():
    eager, graphed = ToyStep(), ToyStep()
    step = GraphedStep(graphed, "cuda")
    for i, tok in enumerate([5, 17, 3, 999, 42]):
        want = eager(*_ids(tok, i))
        got = step(*_ids(tok, i))
        assert torch.equal(got, want)
    assert len(step.graphs) == 1 and not step.failed
    assert graphed.calls == step.warmup + 1  # warm-up + one capture, then replays only


@pytest.mark.cuda
def test_graph_key_is_shape_and_dtype_only():
    step = GraphedStep(ToyStep(), "cuda")
    step(*_ids(1, 0))
    step(torch.tensor([2], device="cuda"), torch.tensor([1], device="cuda", dtype=torch.int32))
    assert len(step.graphs) == 2
    for key in step.graphs:
        assert all(isinstance(v, (tuple, torch.dtype)) for v in key)


@pytest.mark.cuda
def test_capture_failure_falls_back_to_eager_once(capsys):
    def syncing(tokens, positions):  # .item() synchronizes: illegal while capturing
        return torch.ones(1, 4, device="cuda") * float(positions.sum().item())

    step = GraphedStep(syncing, "cuda")
    for i in range(3):
        assert step(*_ids(0, i)).flatten()[0].item() == i
    assert len(step.failed) == 1 and not step.graphs
    assert capsys.readouterr().err.count("capture failed") == 1
    assert torch.randn(8, device="cuda").isfinite().all()  # the device's random ops survive the failed capture


@pytest.mark.cuda
def test_capture_after_runs_the_first_calls_eagerly():
    eager, graphed = ToyStep(), ToyStep()
    step = GraphedStep(graphed, "cuda", warmup=1, capture_after=1)
    for i, tok in enumerate([5, 17, 3]):
        assert torch.equal(step(*_ids(tok, i)), eager(*_ids(tok, i)))
        assert len(step.graphs) == (0 if i == 0 else 1)
    assert graphed.calls == 1 + 1 + 1  # eager first call, one warm-up, one capture; then replays


class ToyBatchStep:
    """A batched-step stand-in: entry row = (token, slot); embeds each token and adds it into the
    cache row at its slot (padding entries: the scratch slot), then reads that row back. Not
    idempotent: a real entry run again (a warm-up or capture on real inputs) changes its logits."""

    def __init__(self, vocab=1000, dim=128, slots=64):
        g = torch.Generator(device="cuda").manual_seed(1)
        self.emb = torch.randn(vocab, dim, generator=g, device="cuda")
        self.w = torch.randn(vocab, dim, generator=g, device="cuda") / dim ** 0.5
        self.cache = torch.zeros(slots, dim, device="cuda")
        self.calls = 0

    def __call__(self, inputs):
        self.calls += 1
        h = self.emb[inputs[:, 0]]
        self.cache.index_add_(0, inputs[:, 1], h)
        return torch.tanh(h + self.cache.index_select(0, inputs[:, 1])) @ self.w.t()


SCRATCH = 63


def _batch(tokens, slots, bucket):
    rows = [[t, s] for t, s in zip(tokens, slots)] + [[0, SCRATCH]] * (bucket - len(tokens))
    return torch.tensor(rows, device="cuda")


@pytest.mark.cuda
def test_batch_graph_per_entry_count_replays_eager_bits_on_padding_capture():
    eager, graphed = ToyBatchStep(), ToyBatchStep()
    padding = torch.tensor([0, SCRATCH], device="cuda")
    step = BatchGraphs(graphed, padding, "cuda")
    for i, (toks, bucket) in enumerate([([5, 17], 2), ([3, 999, 42], 4), ([7], 2), ([8, 9, 10, 11], 4)]):
        x = _batch(toks, list(range(10 * i, 10 * i + len(toks))), bucket)  # each real slot written once
        n = len(toks)  # padding rows differ: warm-up and capture added into the scratch row too
        assert torch.equal(step(x)[:n], eager(x)[:n])
        assert torch.equal(graphed.cache[:SCRATCH], eager.cache[:SCRATCH])  # capture touched no real row
    assert sorted(step.graphs) == [2, 4] and not step.failed
    assert graphed.calls == 2 * (step.warmup + 1)  # per bucket: warm-up + one capture, then replays only


@pytest.mark.cuda
def test_batch_capture_failure_runs_that_bucket_eagerly(capsys):
    def syncing(inputs):  # .item() synchronizes: illegal while capturing
        return torch.ones(inputs.shape[0], 4, device="cuda") * float(inputs[:, 0].sum().item())

    step = BatchGraphs(syncing, torch.tensor([0, SCRATCH], device="cuda"), "cuda")
    for t in (1, 2, 3):
        assert step(_batch([t], [0], 2))[0, 0].item() == t
    assert list(step.failed) == [2] and not step.graphs
    assert torch.randn(8, device="cuda").isfinite().all()
    assert capsys.readouterr().err.count("capture failed, batched decode of 2 entries runs eagerly") == 1
