"""The mmq_triton kernels inside the whole model, against the reference backend: under Triton's
CPU interpreter in CI (tiny synthesized models), on the GPU with ``-m cuda``."""

from __future__ import annotations

import os

import pytest
import torch
from gguf import GGMLQuantizationType as QT

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton and any kernel module is imported
pytest.importorskip("triton")

from minfer_core.engine import Engine  # noqa: E402
from minfer_core.synth import synthesize, tiny_layout, write_layout  # noqa: E402

MIXES = {
    # the 7B's mix: q4_K everywhere, q6_K for ffn_down and the output head -> fuse mode 2
    "plane_only": {"ffn_down": QT.Q6_K, "output": QT.Q6_K},
    # the 7B's other layers: v q6_K beside q and k q4_K (one weight qk; with v one decode launch on the GPU)
    "v_q6k": {"attn_v": QT.Q6_K, "ffn_down": QT.Q6_K, "output": QT.Q6_K},
    # the 0.5B's mix: Q5_0/Q8_0 beside q4_K/q6_K -> mode 2 degrades to 1
    "mixed": {"attn_q": QT.Q5_0, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "ffn_down": QT.Q6_K, "output": QT.Q8_0},
}


def tiny_model(tmp_path, mix: str):
    md, ts = tiny_layout("qwen2", QT.Q4_K)
    ts = [(n, MIXES[mix].get(n.split(".")[-2], q) if q != QT.F32 else q, s) for n, q, s in ts]
    layout, out = tmp_path / f"{mix}.layout.gguf", tmp_path / f"{mix}.gguf"
    write_layout(layout, md, ts)
    synthesize(layout, out, progress=False)
    return out


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("mix,mode", [("plane_only", 2), ("mixed", 1),
                                      pytest.param("v_q6k", 2, marks=pytest.mark.cuda)])  # its pair: GPU
def test_mmq_model_matches_reference(tmp_path, mix, mode):
    path = tiny_model(tmp_path, mix)
    ref = Engine.load(path, backend="reference", device=device(), n_ctx=128, progress=False)
    mmq = Engine.load(path, device=device(), n_ctx=128, progress=False)
    assert mmq.plan.fuse_mode == mode, mmq.plan.fuse_reason
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    lr = ref.prefill(ids, all_logits=True).float().cpu()
    lm = mmq.prefill(ids, all_logits=True).float().cpu()
    # bf16 weights and activations in the prefill GEMMs: ~2^-8 relative error per product, and
    # the errors of two layers compound; 3e-2 of the logits' norm leaves a margin of ~3x.
    rel = float((lm - lr).norm() / lr.norm())
    assert rel < 3e-2, rel
    # greedy decode: the same tokens for as long as the reference's top-2 margin exceeds the error
    tol = 4 * float((lm - lr).abs().max())
    tr, tm = ref.decode(int(lr[-1].argmax())), mmq.decode(int(lr[-1].argmax()))
    agreed = 0
    for _ in range(6):
        top2 = torch.topk(tr.float().cpu(), 2).values
        if float(top2[0] - top2[1]) < tol:
            break
        assert int(tr.argmax()) == int(tm.argmax())
        agreed += 1
        t = int(tr.argmax())
        tr, tm = ref.decode(t), mmq.decode(t)
    counts = mmq.model.rt.counts
    assert counts["mmq.attn.splitkv"] > 0 and any(k.startswith("mmq.gemv.") for k in counts), counts
    assert any(k.startswith("mmq.nb.q4_k") for k in counts), counts
    assert any(k.startswith(f"mmq.fuse{mode}.") for k in counts), counts
    if mix == "mixed":
        assert any(k.startswith("mmq.generic.q5_0") for k in counts), counts


@pytest.mark.cuda
@pytest.mark.parametrize("start", [0, 7])
def test_prefill_flash_attention_matches_reference(start):
    from minfer_core.reference import attention_prefill
    from minfer_mmq_triton.ops.attention import prefill_flash

    g = torch.Generator(device="cuda").manual_seed(0)
    t, h, hkv, d = 300, 28, 4, 128
    q = torch.randn(t, h, d, device="cuda", generator=g)
    k = torch.randn(start + t, hkv, d, device="cuda", generator=g).half()
    v = torch.randn(start + t, hkv, d, device="cuda", generator=g).half()
    ref = attention_prefill(q.half().float(), k, v, start)
    got = prefill_flash(q, k, v, start)
    # f16 inputs and f16 softmax-weighted sums: ~1e-3 relative error per output
    assert float((got - ref).norm() / ref.norm()) < 2e-3
    act = prefill_flash(q, k, v, start, plane=True)  # the o matmul's plane alone: the same rows in bf16
    assert act.f32 is None and torch.equal(act.plane, got.to(torch.bfloat16))


@pytest.mark.cuda
def test_prefill_graph_replays_the_eager_prefill(tmp_path):
    """cuda_graphs wraps the prefill step: a prompt bucket is captured the second time it is seen,
    and every run gives the eager forward's logits; decoding after it matches too."""
    path = tiny_model(tmp_path, "plane_only")
    eng = Engine.load(path, device="cuda", n_ctx=256, progress=False)
    assert eng.plan.prefill_step is not None and eng.plan.prefill_step.label == "cuda_graphs.prefill_step"
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    wrapped, eng.prefill_step = eng.prefill_step, None  # the oracle: the engine's plain forward
    want = eng.prefill(ids).float().clone()
    d_want = eng.decode(7).float().clone()
    eng.prefill_step = wrapped
    for run in range(3):
        eng.reset()
        got = eng.prefill(ids).float()
        assert torch.allclose(got, want, rtol=1e-3, atol=1e-3), float((got - want).abs().max())
        assert int(got.argmax()) == int(want.argmax())
        assert len(eng.prefill_step.fn.graphs) == (0 if run == 0 else 1)
        assert torch.allclose(eng.decode(7).float(), d_want, rtol=1e-3, atol=1e-3)
    assert not eng.prefill_step.fn.failed


def test_planes_replace_raw_bytes(tmp_path, monkeypatch):
    """Once every chosen kernel of a weight reads planes (prefill: the q4_K/q6_K planes; decode:
    the q4_K plane and the q6_K decode plane), its raw GGUF bytes are released; a kernel that
    still reads them keeps them (q4_K with its plane builder off; the reference backend)."""
    from minfer_core.quants import info

    path = tiny_model(tmp_path, "plane_only")
    eng = Engine.load(path, device=device(), n_ctx=64, progress=False)
    ws = eng.model.rt.weights
    assert [n for n, w in ws.items() if w.raw is not None] == []
    assert eng.plan.released_raw == sum(w.n_out * info(w.qtype).row_bytes(w.n_in) for w in ws.values())
    monkeypatch.setenv("MINFER_MMQ_Q4K_DSC", "0")
    ws = Engine.load(path, device=device(), n_ctx=64, progress=False).model.rt.weights
    assert {n for n, w in ws.items() if w.raw is not None} == {n for n, w in ws.items() if w.qtype == QT.Q4_K}
    monkeypatch.delenv("MINFER_MMQ_Q4K_DSC")
    ws = Engine.load(path, backend="reference", device=device(), n_ctx=64, progress=False).model.rt.weights
    assert all(w.raw is not None for w in ws.values())


@pytest.mark.cuda
@pytest.mark.parametrize("repeats", [12, 40])
def test_7b_prefill_agrees_with_reference(tmp_path, repeats):
    """The synthesized full-size 7B (models/qwen2-7b-q4_k_m layout) on the GPU: a ~90- or ~300-token prompt
    (the matmuls' routes differ above 128 rows) through the default plan (prefill kernels, bf16 operands)
    against the reference backend (f32 dequantized weights). Tolerance 5e-2 relative on the logits: each
    prefill matmul rounds both operands to bf16 (u = 2^-9, ~sqrt(2) u = 0.0028 per matmul output) and 28
    layers x 4 matmuls add ~112 such errors, ~0.0028 * sqrt(112) = 0.03; 5e-2 leaves 1.7x. Greedy tokens
    (teacher-forced on the reference's) must agree wherever the reference's top-2 margin exceeds twice the
    logit error."""
    from pathlib import Path

    template = Path(__file__).resolve().parents[1] / "models" / "qwen2-7b-q4_k_m.layout.gguf.xz"
    path = tmp_path / "7b.gguf"
    synthesize(template, path, progress=False)
    ref = Engine.load(path, backend="reference", device="cuda", n_ctx=512, progress=False)
    ids = ref.tok.encode("The history of computing is long. " * repeats)
    assert len(ids) >= 64
    lr = ref.prefill(ids)[-1].float().cpu()
    stream = [lr]
    for _ in range(24):  # teacher-forced positions: enough that some margin clears the tolerance
        stream.append(ref.decode(int(stream[-1].argmax())).float().cpu())
    del ref
    torch.cuda.empty_cache()
    eng = Engine.load(path, device="cuda", n_ctx=512, progress=False)
    lm = eng.prefill(ids)[-1].float().cpu()
    rel = float((lm - lr).norm() / lr.norm())
    assert rel < 5e-2, rel
    tol = 2 * float((lm - lr).abs().max())
    got = [lm] + [eng.decode(int(s.argmax())).float().cpu() for s in stream[:-1]]
    checked, margins = 0, []
    for want, have in zip(stream, got):
        top2 = torch.topk(want, 2).values
        margins.append(float(top2[0] - top2[1]))
        if margins[-1] > tol:
            assert int(have.argmax()) == int(want.argmax()), checked
            checked += 1
    assert checked >= 1, f"every top-2 margin under {tol} (rel {rel}, margins {margins}): nothing compared"
    assert eng.model.rt.counts["mmq.pre.rope_kv"] > 0 and eng.plan.prefill["blk.0.ffn_gate_up"].label == "mmq.nb.q4_k"
