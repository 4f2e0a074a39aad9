"""A solo engine's greedy chain (``minfer_core.greedy_chain``): its picks are the single-stream
engine's greedy tokens (``Engine.decode`` and torch's argmax), whether each pick is fed back where
it lies, restarted from an id or from another device tensor, or each step is run three times over
(as a CUDA graph's warm-up and capture run it)."""

from __future__ import annotations

import pytest
import torch

from minfer_core.engine import Engine
from minfer_core.greedy_chain import GreedyChain


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    return Engine.load(tiny_qwen2, backend="reference", device="cpu", n_ctx=128, progress=False)


IDS = torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(3)).tolist()


def single_stream(engine, n) -> list[int]:
    """The greedy tokens after IDS, one decode step and one argmax at a time."""
    engine.reset()
    logits, out = engine.prefill(IDS)[-1], []
    while len(out) < n:
        out.append(int(torch.argmax(logits)))
        logits = engine.decode(out[-1])
    return out


def chained(engine, chain, n, restart_at=()) -> list[int]:
    """The chain's tokens after IDS (prefilled, its first token from the prompt's logits), each
    pick fed back as the tensor it came in, or restarted from its id at ``restart_at``."""
    engine.reset()
    out = [int(torch.argmax(engine.prefill(IDS)[-1]))]
    pick = out[0]
    for i in range(n - 1):
        pos = len(IDS) + i
        pick = chain(int(pick) if i in restart_at or isinstance(pick, int) else pick, pos)
        assert pick.shape == (1,) and pick.dtype == torch.long
        out.append(int(pick))
    return out


def test_chain_equals_single_stream(engine):
    want = single_stream(engine, 12)
    chain = GreedyChain(engine)
    assert chained(engine, chain, 12) == want
    assert chained(engine, GreedyChain(engine), 12, restart_at={3, 4, 8}) == want


def test_each_step_run_three_times_changes_nothing(engine, monkeypatch):
    want = single_stream(engine, 10)

    def thrice(step):
        def run():
            step()
            step()
            return step()
        return run
    monkeypatch.setattr(engine, "wrap_decode", thrice)
    assert chained(engine, GreedyChain(engine), 10) == want


def test_a_pick_lasts_two_steps_and_restarts_read_tensors(engine):
    chain = GreedyChain(engine)
    engine.reset()
    first = int(torch.argmax(engine.prefill(IDS)[-1]))
    p = len(IDS)
    a = chain(first, p)
    a_value = int(a)
    assert chain.holds(a, p + 1) and not chain.holds(a, p + 2)
    b = chain(a, p + 1)
    assert int(a) == a_value and b.data_ptr() != a.data_ptr()  # a's pick outlives the next step
    c = chain(b.clone(), p + 2)  # the same value from another tensor: a restart, the same pick
    want = single_stream(engine, 4)
    assert [first, a_value, int(b), int(c)] == want
