"""The cuda_graphs plugin: hook wiring (CPU) and capture/replay/fallback (GPU).

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
from minfer_cuda_graphs.graph import LABEL, PREFILL_LABEL, GraphedStep, graphed_prefill, graphed_step  # noqa: E402


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
    assert names == {"minfer_applicable", "minfer_wrap_decode_step", "minfer_wrap_prefill_step"}
    assert all(h.has_spec() for h in pm.get_hookcallers(plugin))


def test_wrapped_step_is_a_callable_candidate():
    c = graphed_step(lambda t, p: t, "cpu")
    assert isinstance(c, Candidate) and callable(c)
    assert (c.plugin, c.label) == ("cuda_graphs", LABEL)
    assert isinstance(c.fn, GraphedStep)
    p = graphed_prefill(lambda t, last: t, "cpu")
    assert (p.plugin, p.label, p.fn.capture_after) == ("cuda_graphs", PREFILL_LABEL, 1)


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


@pytest.mark.cuda
def test_capture_after_runs_the_first_calls_eagerly():
    eager, graphed = ToyStep(), ToyStep()
    step = GraphedStep(graphed, "cuda", warmup=1, capture_after=1)
    for i, tok in enumerate([5, 17, 3]):
        assert torch.equal(step(*_ids(tok, i)), eager(*_ids(tok, i)))
        assert len(step.graphs) == (0 if i == 0 else 1)
    assert graphed.calls == 1 + 1 + 1  # eager first call, one warm-up, one capture; then replays
