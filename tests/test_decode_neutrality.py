"""Decode neutrality (seed §2.2): the single-token path is planned from the decode order alone.
Whatever the six gates say, decode picks the same kernels and a short prompt's greedy stream is
byte-identical."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from minfer_core.run_configs import applied, parse_config  # noqa: E402
from minfer_core.engine import Engine  # noqa: E402
from minfer_mmq_triton.routes import GATES  # noqa: E402
from test_kernels_e2e import device, tiny_model  # noqa: E402

# The interpreter runs the decode kernels slowly (~10 s a token here), so on the CPU the plans
# are compared for every gate and the logits for one; the GPU runs all 128 tokens for every gate.
N_TOKENS = 128 if torch.cuda.is_available() else 1
STREAM_GATES = GATES if torch.cuda.is_available() else ("MINFER_MMQ",)


def decode_signature(engine: Engine) -> dict:
    p = engine.plan
    return {"matmul": {n: c.label for n, c in p.decode.items()},
            "attention": p.attention["decode"].label,
            "ops": {k: c.label for k, c in p.decode_ops.items()}}


def greedy(engine: Engine, ids: list[int], n: int) -> list[int]:
    engine.reset()
    logits = engine.prefill(ids)[-1]
    out = []
    for i in range(n):
        out.append(int(torch.argmax(logits)))
        if i + 1 < n:
            logits = engine.decode(out[-1])
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("neutral"), "plane_only")


@pytest.fixture(scope="module")
def baseline(model):
    e = Engine.load(model, device=device(), n_ctx=N_TOKENS + 32, progress=False)
    ids = list(range(40, 48)) if torch.cuda.is_available() else [40]  # under 16: decode kernels only
    return decode_signature(e), greedy(e, ids, N_TOKENS), ids


@pytest.mark.parametrize("gate", GATES)
def test_gate_off_leaves_decode_unmoved(model, baseline, gate):
    sig, tokens, ids = baseline
    with applied(parse_config(f"{gate}=0")):
        e = Engine.load(model, device=device(), n_ctx=N_TOKENS + 32, progress=False)
    assert e.ctx.gates[gate] in (False, 0)  # the gate really is off for this load
    assert decode_signature(e) == sig
    if gate not in STREAM_GATES:
        return
    assert greedy(e, ids, N_TOKENS) == tokens
    assert not any(k.startswith(("mmq.nb", "mmq.generic", "mmq.prepass", "mmq.fuse", "f16.gemm"))
                   for k in e.model.rt.counts), e.model.rt.counts
