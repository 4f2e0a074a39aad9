"""Shared fixtures: the real models, fetched the way a user's first run fetches them."""

from __future__ import annotations

import gc
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under the CPU interpreter in CI; the variable must be set before triton
    # is first imported anywhere in the session.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Triton decides at import whether each jit function (its own included) is interpreted: import
    # it now, so that a test that unsets the variable (the CPU as a user has it) breaks no later one.
    try:
        import triton  # noqa: F401
    except ImportError:
        pass

from minfer_core.fetch import pull


@pytest.fixture(autouse=True)
def _release_gpu_memory(request):
    """After a GPU test, free what it left in reference cycles: a batched engine sizes its KV pool
    to 90% of the GPU by default, which the next test files would otherwise run out of memory under."""
    yield
    if torch.cuda.is_available() and request.node.get_closest_marker("cuda"):
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def qwen_path():
    return pull("qwen2.5-coder-0.5b", quiet=True)


@pytest.fixture(scope="session")
def smollm_path():
    return pull("smollm2-135m", quiet=True)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    """A tiny synthesized Qwen2 (Q8_0 weights, random values): the CPU engine tests' model file."""
    from gguf import GGMLQuantizationType as QT

    from minfer_core.synth import synthesize, tiny_layout, write_layout

    d = tmp_path_factory.mktemp("tiny_qwen2")
    md, ts = tiny_layout("qwen2", QT.Q8_0)
    write_layout(d / "t.layout.gguf", md, ts)
    synthesize(d / "t.layout.gguf", d / "t.gguf", progress=False)
    return d / "t.gguf"


@pytest.fixture(scope="session")
def synth_05b(tmp_path_factory):
    """A full-size model with Qwen2.5-Coder-0.5B Q4_K_M's layout and random weights: what GPU tests
    run on where the real file cannot be fetched (the GPU machine has no network)."""
    from pathlib import Path

    from minfer_core.synth import synthesize

    template = Path(__file__).resolve().parents[1] / "models" / "qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz"
    out = tmp_path_factory.mktemp("synth") / "05b.gguf"
    synthesize(template, out, progress=False)
    return out


@pytest.fixture(scope="session")
def synth_7b(tmp_path_factory):
    """As :func:`synth_05b`, with Qwen2-7B Q4_K_M's layout (4.7 GB; q4_K weights of K a multiple
    of 256, which the 0.5B mostly lacks)."""
    from pathlib import Path

    from minfer_core.synth import synthesize

    template = Path(__file__).resolve().parents[1] / "models" / "qwen2-7b-q4_k_m.layout.gguf.xz"
    out = tmp_path_factory.mktemp("synth") / "7b.gguf"
    synthesize(template, out, progress=False)
    return out
