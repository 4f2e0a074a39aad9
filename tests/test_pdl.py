"""Programmatic dependent launch changes when a decode kernel starts, never what it computes: with
``MINFER_PDL=0`` and without it, every decode step's logits are bit-for-bit the same, with the step
replayed as a CUDA graph and run eagerly, and so are a batched engine's (rows GEMMs, row tiles). A
kernel that read its predecessor's output before ``griddepcontrol.wait`` would race and, sooner or
later, differ."""

from __future__ import annotations

import pytest
import torch

from minfer_core.batch_engine import BatchEngine
from minfer_core.engine import Engine
from minfer_core.run_configs import applied, parse_config
from test_batch_engine import Collect, run
from test_kernels_e2e import tiny_model

pytestmark = pytest.mark.cuda
N_STEPS = 48


def _stream(path, spec: str) -> tuple[list[torch.Tensor], Engine]:
    cfg = parse_config(spec)
    with applied(cfg):
        e = Engine.load(path, device="cuda", n_ctx=N_STEPS + 32, progress=False, blocked=cfg.blocked)
    e.reset()
    logits = e.prefill(list(range(40, 48)))[-1]  # under 16 tokens: the decode kernels only
    out = []
    for _ in range(N_STEPS):
        logits = e.decode(int(torch.argmax(logits)))
        out.append(logits.clone())
    return out, e


HOPPER = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                            reason="PDL needs compute capability 9.0")


@HOPPER
@pytest.mark.parametrize("mix", ["plane_only", "mixed", "v_q6k"])
@pytest.mark.parametrize("graphs", [True, False])
def test_pdl_leaves_logits_bitwise_equal(tmp_path, mix, graphs):
    path = tiny_model(tmp_path, mix)
    extra = "" if graphs else ",plugin=no:cuda_graphs"
    on, e_on = _stream(path, "MINFER_PDL=1" + extra)
    off, e_off = _stream(path, "MINFER_PDL=0" + extra)
    assert e_on.plan.attention["decode"].fn.pdl and not e_off.plan.attention["decode"].fn.pdl  # the switch took
    if mix == "v_q6k":  # q|k and v in one launch: inside clusters under PDL, through the split scratch without
        assert all(len(e.plan.decode_groups) == 2 for e in (e_on, e_off))
    for e in (e_on, e_off):  # the step really is (or is not) a replayed graph
        assert (e.plan.decode_step is not None) == graphs
        if graphs:
            assert e.step.fn.graphs and not e.step.fn.failed, e.step.fn.failed
    for i, (a, b) in enumerate(zip(on, off)):
        assert torch.equal(a, b), f"step {i}: max |diff| {float((a - b).abs().max())}"


def _batched(path, spec: str, parallel: int, prompts: list[list[int]], n: int) -> list[list[torch.Tensor]]:
    """Each request's logits, step by step, from an engine of ``parallel`` sequences (decode graphs;
    8: the rows GEMMs and (Hopper) the warpgroup-MMA GEMM's 8-row groups, 32: 32-row tiles)."""
    with applied(parse_config(spec)):
        be = BatchEngine.load(path, n_ctx=256, parallel=parallel, max_queue=16, progress=False)
    assert be.rows == (parallel <= 8) and be.attn.fn.pdl == spec.endswith("1")  # the switch took
    c, got = Collect(), {}
    reqs = [c.req(p, n, ignore_eos=True) for p in prompts]
    run(be, {0: reqs[:5], 2: reqs[5:]}, got)
    labels = ("mmq.rows.wgmma.q4_k", "mmq.rows.q4_k", "mmq.rows.q6_k") if be.rows else ("mmq.nb.q4_k", "mmq.nb.q6_k")
    assert all(be.model.rt.counts[label] > 0 for label in labels), be.model.rt.counts
    return [[row.cpu() for row in got[r.id]] for r in reqs]


@HOPPER
@pytest.mark.parametrize("parallel", [8, 32])
def test_pdl_leaves_batched_logits_bitwise_equal(synth_7b, parallel):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 1000, (k,), generator=g).tolist() for k in (5, 17, 40, 64, 90, 3, 33, 120)]
    on = _batched(synth_7b, "MINFER_PDL=1", parallel, prompts, 24)
    off = _batched(synth_7b, "MINFER_PDL=0", parallel, prompts, 24)
    for i, (a, b) in enumerate(zip(on, off)):
        assert len(a) == len(b) == 24
        for j, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"request {i} step {j}: max |diff| {float((x - y).abs().max())}"
