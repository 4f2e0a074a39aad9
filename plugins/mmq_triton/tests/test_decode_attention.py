"""Split-KV decode attention against float64 attention math and torch SDPA.

Tolerance: ``||out - ref|| / ||ref|| < 2e-3``. The kernel rounds ``q`` (scaled) and the
probabilities to float16 once each for the tensor-core products (float32 accumulation): ~2^-11
relative per operand, measured 2-3e-4; an indexing or masking bug gives errors of order 1.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minfer_mmq_triton.ops.attention import LABEL, attention_candidates  # noqa: E402

TOL = 2e-3


def oracle(q, k, v, n_valid: int) -> torch.Tensor:
    """float64 softmax(q k^T / sqrt(D)) v over the first n_valid positions, GQA by head groups."""
    h, d = q.shape
    hkv = k.shape[1]
    qg = q.double().view(hkv, h // hkv, d)
    kk, vv = k[:n_valid].double(), v[:n_valid].double()
    p = torch.softmax(torch.einsum("grd,ngd->grn", qg, kk) / math.sqrt(d), dim=-1)
    return torch.einsum("grn,ngd->grd", p, vv).reshape(h * d)


def sdpa(q, k, v, n_valid: int) -> torch.Tensor:
    """torch's SDPA (float32) with the KV heads repeated."""
    h, d = q.shape
    rep = h // k.shape[1]
    kk = k[:n_valid].float().transpose(0, 1).repeat_interleave(rep, 0)
    vv = v[:n_valid].float().transpose(0, 1).repeat_interleave(rep, 0)
    return F.scaled_dot_product_attention(q.float()[:, None], kk, vv)[:, 0].reshape(h * d)


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _inputs(h, hkv, d, ctx, gen, device="cpu"):
    q = torch.randn(h, d, generator=gen, device=device)
    k = torch.randn(ctx, hkv, d, generator=gen, device=device).half()
    v = torch.randn(ctx, hkv, d, generator=gen, device=device).half()
    return q, k, v


def test_offers_split_kv_for_decode_and_flash_for_gpu_prefill(make_ctx):
    (c,) = attention_candidates("decode", make_ctx(device="cpu"))
    assert c.plugin == "mmq_triton" and c.label == LABEL
    assert attention_candidates("prefill", make_ctx(device="cpu")) == []  # the interpreter has no flash SDPA
    if torch.cuda.is_available():
        (p,) = attention_candidates("prefill", make_ctx(device="cuda"))
        assert p.label == "mmq.attn.flash"


@pytest.mark.parametrize("h,hkv,d,ctx,nvs", [
    (14, 2, 64, 300, (1, 77, 300)),  # qwen2.5-0.5B heads; n_valid 1, mid-split, the whole cache
    (9, 3, 64, 130, (64, 100)),  # smollm2-135M heads (3 per group)
    (4, 2, 80, 64, (33,)),  # head dim not a power of two
])
def test_splitkv_matches_math_and_sdpa(h, hkv, d, ctx, nvs):
    gen = torch.Generator().manual_seed(h * d + ctx)
    q, k, v = _inputs(h, hkv, d, ctx, gen)
    (c,) = attention_candidates("decode", None)
    for nv in nvs:
        out = c.fn(q, k, v, torch.tensor(nv, dtype=torch.int32))
        assert out.shape == (h * d,) and out.dtype == torch.float32
        assert rel(out, oracle(q, k, v, nv)) < TOL
        assert rel(out, sdpa(q, k, v, nv)) < TOL


def test_positions_past_n_valid_are_never_read():
    gen = torch.Generator().manual_seed(5)
    q, k, v = _inputs(14, 2, 64, 200, gen)
    (c,) = attention_candidates("decode", None)
    nv = torch.tensor(90, dtype=torch.int32)
    a = c.fn(q, k, v, nv)
    k[90:] = float("nan")
    v[90:] = float("inf")
    b = c.fn(q, k, v, nv)
    assert torch.equal(a, b)


def test_splits_past_n_valid_are_masked_whatever_their_partials_hold():
    """The combine loads every split's partials before it knows which splits saw a position: those
    of the others (stale from a longer context, or never written) must not reach the output."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = _inputs(14, 2, 64, 300, gen)
    (c,) = attention_candidates("decode", None)
    nv = torch.tensor(40, dtype=torch.int32)
    clean = c.fn(q, k, v, nv)
    for buf in c.fn._scratch.values():  # the partials (output rows, maxima, sums) of every split
        for t in buf:
            t.fill_(float("nan"))
    assert torch.equal(c.fn(q, k, v, nv), clean)
    assert rel(clean, oracle(q, k, v, 40)) < TOL


def test_cache_length_changes_nothing():
    """The split count comes from the device, not the cache length: the same valid rows in a
    longer cache give the same bits (a step costs what its context costs, not what was allocated)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = _inputs(14, 2, 64, 200, gen)
    (c,) = attention_candidates("decode", None)
    nv = torch.tensor(90, dtype=torch.int32)
    long_k = torch.cat([k, torch.randn(1800, *k.shape[1:], generator=gen).to(k.dtype)])
    long_v = torch.cat([v, torch.randn(1800, *v.shape[1:], generator=gen).to(v.dtype)])
    assert torch.equal(c.fn(q, k, v, nv), c.fn(q, long_k, long_v, nv))


# -- GPU ------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("h,hkv,d", [(28, 4, 128), (14, 2, 64)])
@pytest.mark.parametrize("nv", [1, 128, 512, 4095, 4096])
def test_splitkv_real_shapes_cuda(h, hkv, d, nv):
    gen = torch.Generator(device="cuda").manual_seed(nv)
    q, k, v = _inputs(h, hkv, d, 4096, gen, "cuda")
    (c,) = attention_candidates("decode", None)
    out = c.fn(q, k, v, torch.tensor(nv, dtype=torch.int32, device="cuda"))
    assert rel(out, oracle(q, k, v, nv)) < TOL
    assert rel(out, sdpa(q, k, v, nv)) < TOL


@pytest.mark.cuda
def test_splitkv_replays_in_a_cuda_graph_with_a_new_n_valid():
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = _inputs(28, 4, 128, 4096, gen, "cuda")
    (c,) = attention_candidates("decode", None)
    nv = torch.tensor(10, dtype=torch.int32, device="cuda")
    c.fn(q, k, v, nv)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = c.fn(q, k, v, nv)
    for n in (1, 700, 4096):
        nv.fill_(n)
        g.replay()
        assert rel(out, oracle(q, k, v, n)) < TOL


def test_splitkv_writes_its_output_quantized_too():
    """``form=True``: pass 2 also writes the output in ``quant_x.FORM``: the digits and block scales
    ``quantize_x`` gives that output (its 16-value sums to float rounding), which carry each value to
    half a unit of the low digit (``s / 512``, ``s`` the block's scale; 1% for float32 rounding)."""
    from minfer_mmq_triton.ops.attention import SplitKVAttention
    from minfer_mmq_triton.ops.quant_x import FORM, quantize_x

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(5)
    q, k, v = _inputs(14, 2, 64, 300, gen, dev)
    for nv in (1, 129, 300):
        act = SplitKVAttention(form=True)(q, k, v, torch.tensor(nv, dtype=torch.int32, device=dev))
        out = act.f32
        assert rel(out, oracle(q, k, v, nv)) < TOL
        xh, xl, xs, x16 = act.forms[FORM]
        want = quantize_x(out.view(1, -1))
        assert all(torch.equal(a, b) for a, b in zip((xh, xl, xs), want[:3]))
        torch.testing.assert_close(x16, want[3], rtol=1e-6, atol=1e-6)
        digits = xh.view(torch.int8).float() + xl.view(torch.int8).float() / 256
        back = (xs.repeat_interleave(32, dim=1) * digits).view(-1)
        assert ((back - out).abs().view(-1, 32).max(dim=1).values <= xs.view(-1) / 512 * 1.01).all()


@pytest.mark.parametrize("block_s,warps", [(32, 4), (128, 8)])
def test_splitkv_other_tiles(block_s, warps):
    """The split kernel at other positions a step and warps (``DECODE_TILE`` candidates) against the oracle."""
    from minfer_mmq_triton.ops.attention import SplitKVAttention

    gen = torch.Generator().manual_seed(block_s)
    q, k, v = _inputs(14, 2, 64, 300, gen)
    for nv in (1, 129, 300):
        out = SplitKVAttention(block_s, warps)(q, k, v, torch.tensor(nv, dtype=torch.int32))
        assert rel(out, oracle(q, k, v, nv)) < TOL


# -- RoPE and the new row's K/V write in the split kernel (``Candidate.fuses`` ``"rope_kv"``) --------

def check_rope_in_attention(h, hkv, d, ctx, nvs, neox, device):
    """Unrotated q, k, v of position ``nv - 1`` (a fused qkv row's views): the output matches the float64
    oracle on q and k rotated by float64 RoPE, row ``nv - 1`` of the caches holds rotated k (within a
    float16 ulp) and v, and no other row changes."""
    from test_decode_fused import assert_f16_within_ulp, ref_rope

    gen = torch.Generator(device=device).manual_seed(h * d + ctx + neox)
    (c,) = attention_candidates("decode", None)
    assert "rope_kv" in c.fuses
    for nv in nvs:
        qkv = torch.randn((h + 2 * hkv) * d, generator=gen, device=device)
        q, k, v = qkv.split([h * d, hkv * d, hkv * d])
        ang = torch.rand(1, d // 2, generator=gen, device=device) * 6
        cos, sin = ang.cos(), ang.sin()
        _, k_cache, v_cache = _inputs(h, hkv, d, ctx, gen, device)
        k_old, v_old = k_cache.clone(), v_cache.clone()
        out = c.fn(q, k_cache, v_cache, torch.tensor(nv, dtype=torch.int32, device=device),
                   rope=(k, v, cos, sin, neox))
        c64, s64 = cos[0].double(), sin[0].double()
        k_rot = ref_rope(k.double().view(hkv, d), c64, s64, neox)
        assert_f16_within_ulp(k_cache[nv - 1], k_rot)
        assert torch.equal(v_cache[nv - 1], v.view(hkv, d).half())
        others = torch.arange(ctx, device=device) != nv - 1
        assert torch.equal(k_cache[others], k_old[others]) and torch.equal(v_cache[others], v_old[others])
        want = oracle(ref_rope(q.double().view(h, d), c64, s64, neox), k_cache, v_cache, nv)
        assert rel(out, want) < TOL


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("h,hkv,d,ctx,nvs", [
    (14, 2, 64, 300, (1, 65, 77, 300)),  # the new row alone; first row of a split; mid-split; the last row
    (4, 2, 80, 64, (33,)),  # head dim not a power of two (lanes past it masked)
])
def test_splitkv_applies_rope_and_writes_the_new_row(h, hkv, d, ctx, nvs, neox):
    check_rope_in_attention(h, hkv, d, ctx, nvs, neox, "cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("neox", [True, False])
def test_splitkv_rope_real_shapes_cuda(neox):
    check_rope_in_attention(28, 4, 128, 4096, (1, 128, 129, 4095, 4096), neox, "cuda")
