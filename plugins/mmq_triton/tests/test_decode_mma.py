"""The tensor-core q4_K / q6_K int8 GEMVs (``q4_k.gemv_mma``, ``q6_k.gemv_mma``; Gluon, GPU only) against gguf's dequantized
weights, at the 7B's shapes and at small shapes with partial steps, uneven splits, bias, residual and
the fused prologues; replayed in a CUDA graph; chosen by ``decode`` under a CUDA load context.

Tolerance as ``test_decode_gemv.TOL_I8`` (x carried as two int8 digits)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from test_decode_gemv import TOL_I8, check, make_weight, oracle_dense

pytestmark = pytest.mark.cuda

#: q4_K MMA configs (tiles, spans a step, warps, lookahead)
CONFIGS = [(1, 2, 4, 1), (1, 4, 4, 0), (2, 2, 4, 1), (4, 1, 4, 0), (1, 2, 2, 0)]


def _q4(w, cfg, split):
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.launch.mma import mma_rows
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    plane = decode.prepare(w)
    t, s, warps, ahead = cfg
    scratch = SplitScratch(w.n_out, mma_rows(t, warps), split)

    def fn(x, **kw):
        return gemv_q4p_mma(x, plane, w.bias, t, s, warps, split, scratch, pdl=True, lookahead=bool(ahead),
                                     **kw)

    fn.scratch = scratch
    return fn


@pytest.mark.parametrize("n,k,split,bias", [(21, 1280, 3, True), (40, 2816, 1, False), (37888, 3584, 1, False),
                                            (3584, 18944, 4, False), (4608, 3584, 2, True)], ids=str)
def test_q4k_mma_gemv_matches_gguf(n, k, split, bias):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(n + k + split)
    w = make_weight(QT.Q4_K, n, k, gen, bias=bias, device="cuda")
    w64 = oracle_dense(w.raw, QT.Q4_K).cuda() if n * k < 1e6 else dequantize(w.raw, QT.Q4_K, k).double()
    xs = []
    for m in (1, 3):
        x = torch.randn(m, k, generator=gen, device="cuda") * 2
        x[:, 5] = 30.0  # one large value per block must not swamp its neighbours beyond TOL_I8
        xs.append(x)
    for cfg in CONFIGS:
        fn = _q4(w, cfg, split)
        for x in xs:
            err = check(fn(x), x, w64, w.bias)
            assert err < TOL_I8, f"{n}x{k} split {split} M={x.shape[0]} {cfg}: {err:.2e}"
        if split > 1:
            assert int(fn.scratch.get(3, "cuda")[1].abs().sum()) == 0


@pytest.mark.parametrize("qtype,n,k,split", [(QT.Q4_K, 21, 1280, 3), (QT.Q4_K, 4608, 3584, 7),
                                               (QT.Q4_K, 3584, 18944, 8), (QT.Q4_K, 37888, 3584, 1),
                                               (QT.Q6_K, 21, 1280, 3), (QT.Q6_K, 3584, 18944, 8)], ids=str)
def test_weight_words_loaded_before_the_pdl_wait_give_the_same_bits(qtype, n, k, split):
    """``early`` (the first step's weight words requested before the PDL wait): the same bits as without,
    with and without the step ahead, whole and partial steps, one step a split and several."""
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.launch.mma import mma_rows
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    gen = torch.Generator(device="cuda").manual_seed(n + k + split + 7)
    w = make_weight(qtype, n, k, gen, bias=True, device="cuda")
    plane = decode.prepare(w)
    x = torch.randn(2, k, generator=gen, device="cuda") * 2
    configs = [(1, 2, 4, 1), (1, 4, 4, 0)] if qtype == QT.Q4_K else [(1, 1, 4, 1), (1, 1, 4, 0)]
    gemv = gemv_q4p_mma if qtype == QT.Q4_K else gemv_q6k_mma
    for t, s, warps, ahead in configs:
        scratch = SplitScratch(n, mma_rows(t, warps), split)
        plain, early = (gemv(x, plane, w.bias, t, s, warps, split, scratch, pdl=True, lookahead=bool(ahead), early=e)
                        for e in (False, True))
        assert torch.equal(early, plain), (t, s, warps, ahead)


def check_prologues(fn, w64, m, gen, tol=TOL_I8):
    """``fn``'s fused RMSNorm + residual and SwiGLU on ``m`` random rows against float64 (worst error
    over ``sum |x w|`` under ``tol``); the normed input ``h`` (M, K)."""
    n, k = w64.shape
    h = torch.randn(m, k, generator=gen, device="cuda") * 3
    res = torch.randn(m, n, generator=gen, device="cuda")
    nw, eps = torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6
    normed = (h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + eps) * nw.double()).float()
    assert check(fn(h, norm=(nw, eps), residual=res) - res, normed, w64, None) < tol
    gu = torch.randn(m, 2 * k, generator=gen, device="cuda") * 2
    g, u = gu.double().chunk(2, dim=-1)
    assert check(fn(gu, swiglu=True), (g * torch.sigmoid(g) * u).float(), w64, None) < tol
    return h


@pytest.mark.parametrize("cfg", [(1, 2, 4, 1), (1, 4, 4, 0)], ids=str)
def test_q4k_mma_gemv_prologues_and_graph_replay(cfg):
    gen = torch.Generator(device="cuda").manual_seed(3)
    n, k = 300, 2048
    w = make_weight(QT.Q4_K, n, k, gen, device="cuda")
    w64 = oracle_dense(w.raw, QT.Q4_K).cuda()
    fn = _q4(w, cfg, 2)
    h = check_prologues(fn, w64, 1, gen)
    want = fn(h).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(h)
    for _ in range(3):
        y.zero_()
        graph.replay()
        assert torch.equal(y, want)


@pytest.mark.parametrize("qtype,n,k,role", [(QT.Q4_K, 4608, 3584, "qkv"), (QT.Q4_K, 37888, 3584, "gate_up"),
                                            (QT.Q6_K, 3584, 18944, "down")], ids=str)
def test_decode_picks_the_tensor_core_gemv_on_cuda(make_ctx, monkeypatch, qtype, n, k, role):
    """A q4_K / q6_K weight on the int8 path runs MODE 3 under a CUDA load context (MODE 2 with
    ``MINFER_DECODE_MMA=0``), with the same fused prologue and the oracle's answer."""
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode

    gen = torch.Generator(device="cuda").manual_seed(4)
    w = make_weight(qtype, n, k, gen, device="cuda")
    w.role = role
    w64 = dequantize(w.raw, qtype, k).double()
    if role == "down":  # SwiGLU of [g | u] and a residual, as the decode step calls it
        gu = torch.randn(1, 2 * k, generator=gen, device="cuda") * 2
        g, u = gu.double().chunk(2, dim=-1)
        res = torch.randn(1, n, generator=gen, device="cuda")
        args, kw, act = gu, {"swiglu": True, "residual": res}, (g * torch.sigmoid(g) * u).float()
    else:  # RMSNorm fused into the quantizer
        h = torch.randn(1, k, generator=gen, device="cuda") * 3
        nw, eps = torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6
        res = None
        args, kw = h, {"norm": (nw, eps)}
        act = (h.double() * torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + eps) * nw.double()).float()
    for env, mode in (("1", 3), ("0", 2)):  # the gate as the core resolves it (declared by mmq_triton)
        ctx = make_ctx(MINFER_DECODE_MMA=env != "0")
        assert decode.decode_config(qtype, n, k, role, decode.mma_enabled(ctx))[3] == mode
        (cand,) = decode.decode_candidates(w, ctx)
        assert "rmsnorm" in cand.fuses and "swiglu" in cand.fuses and "residual" in cand.fuses
        y = cand.fn(args, **kw)
        assert check(y if res is None else y - res, act, w64, None) < TOL_I8, env


#: q6_K MMA configs (tiles, blocks a step, warps, lookahead)
Q6_CONFIGS = [(1, 1, 4, 0), (2, 1, 4, 0), (1, 2, 4, 0), (1, 2, 2, 0), (1, 1, 4, 1), (2, 2, 4, 1), (1, 1, 8, 1)]


@pytest.mark.parametrize("n,k,split,bias", [(21, 1280, 3, True), (40, 2816, 1, False), (3584, 18944, 4, False),
                                            (30000, 3584, 1, False)], ids=str)
def test_q6k_mma_gemv_matches_gguf(n, k, split, bias):
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.launch.mma import mma_rows
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    gen = torch.Generator(device="cuda").manual_seed(n + k + split + 1)
    w = make_weight(QT.Q6_K, n, k, gen, bias=bias, device="cuda")
    w64 = oracle_dense(w.raw, QT.Q6_K).cuda() if n * k < 1e6 else dequantize(w.raw, QT.Q6_K, k).double()
    plane = decode.prepare(w)
    for t, s, warps, ahead in Q6_CONFIGS:
        scratch = SplitScratch(n, mma_rows(t, warps), split)
        for m in (1, 3):
            x = torch.randn(m, k, generator=gen, device="cuda") * 2
            x[:, 5] = 30.0
            y = gemv_q6k_mma(x, plane, w.bias, t, s, warps, split, scratch, pdl=True, lookahead=bool(ahead))
            err = check(y, x, w64, w.bias)
            assert err < TOL_I8, f"{n}x{k} split {split} M={m} {(t, s, warps, ahead)}: {err:.2e}"
        if split > 1:
            assert int(scratch.get(3, "cuda")[1].abs().sum()) == 0


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_mma_gemv_reads_the_attention_output_form(qtype):
    """The tensor-core GEMV of the 7B's o projection, handed the decode attention's output with its
    ``quant_x.FORM`` (``fn(x, forms=...)``), skips quantizing x and gives what it gives from x alone
    (the same digits; the 16-value sums to float rounding), within TOL_I8 of gguf's weights."""
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode, tiles
    from minfer_mmq_triton.ops.attention import SplitKVAttention
    from minfer_mmq_triton.ops.quant_x import FORM

    gen = torch.Generator(device="cuda").manual_seed(7)
    n = k = 3584
    w = make_weight(qtype, n, k, gen, device="cuda")
    config = tiles.decode_config(qtype, n, k, "o", mma=True)
    assert config[3] == 3, config
    fn = decode.make_gemv(qtype, decode.prepare(w), None, n, k, config, pdl=True)
    assert FORM in fn.reads
    q = torch.randn(28, 128, generator=gen, device="cuda")
    kv = torch.randn(2, 512, 4, 128, generator=gen, device="cuda").half()
    act = SplitKVAttention(form=True, pdl=True)(q, kv[0], kv[1], torch.tensor(400, dtype=torch.int32, device="cuda"))
    x = act.f32.view(1, -1)
    res = torch.randn(1, n, generator=gen, device="cuda")
    y_form = fn(x, residual=res, forms=act.forms)
    y = fn(x, residual=res)
    torch.testing.assert_close(y_form, y, rtol=1e-5, atol=1e-5 * y.abs().max().item())
    assert check(y_form - res, x, dequantize(w.raw, qtype, k).double(), None) < TOL_I8


@pytest.mark.parametrize("down_type", [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_gate_up_gemv_writes_the_swiglu_form_for_down(make_ctx, down_type):
    """The 7B's gate|up GEMV asked for ``glu_out`` returns its product with the same bits as without it
    (its programs pair gate and up rows instead of taking a run of rows) and ``silu(g) * u`` of that
    product in ``quant_x.GLU_FORM``: the quantizer's block scales and digits for the same values (a
    digit pair off by at most one unit of the low digit where ``silu`` rounds differently), its 16-value
    sums to float rounding. The down GEMV handed that form gives gguf's answer within TOL_I8, with the
    residual and M = 1 and 3."""
    from minfer_core.dequant import dequantize
    from minfer_core.weights import Activation
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.ops.quant_x import GLU_FORM, quantize_x

    gen = torch.Generator(device="cuda").manual_seed(11)
    ff, e = 18944, 3584
    gu_w = make_weight(QT.Q4_K, 2 * ff, e, gen, device="cuda")
    gu_w.role = "gate_up"
    down_w = make_weight(down_type, e, ff, gen, device="cuda")
    down_w.role = "down"
    ctx = make_ctx()
    (gu_c,) = decode.decode_candidates(gu_w, ctx)
    (down_c,) = decode.decode_candidates(down_w, ctx)
    assert "glu_out" in gu_c.fuses and GLU_FORM in down_c.reads
    down64 = dequantize(down_w.raw, down_type, ff).double()
    for m in (1, 3):
        h = torch.randn(m, e, generator=gen, device="cuda") * 3
        nw, eps = torch.rand(e, generator=gen, device="cuda") + 0.5, 1e-6
        act = gu_c.fn(h, norm=(nw, eps), glu_out=True)
        assert isinstance(act, Activation) and set(act.forms) == {GLU_FORM}
        assert torch.equal(act.f32, gu_c.fn(h, norm=(nw, eps)))
        xh, xl, xs, x16 = (t.view(m, -1) for t in act.forms[GLU_FORM])
        wh, wl, ws, w16 = (t.view(m, -1) for t in quantize_x(act.f32, swiglu=True))
        torch.testing.assert_close(xs, ws, rtol=1e-6, atol=0)
        got = xh.view(torch.int8).int() * 256 + xl.view(torch.int8).int()
        want = wh.view(torch.int8).int() * 256 + wl.view(torch.int8).int()
        assert (got - want).abs().max().item() <= 1
        torch.testing.assert_close(x16, w16, rtol=1e-5, atol=1e-5 * w16.abs().max().item())
        g, u = act.f32.double().chunk(2, dim=-1)
        res = torch.randn(m, e, generator=gen, device="cuda")
        y = down_c.fn(act.f32, swiglu=True, residual=res, forms=act.forms)
        assert check(y - res, (g * torch.sigmoid(g) * u).float(), down64, None) < TOL_I8
        plain = down_c.fn(act.f32, swiglu=True, residual=res)
        torch.testing.assert_close(y, plain, rtol=1e-5, atol=1e-5 * plain.abs().max().item())
