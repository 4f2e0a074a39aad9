"""The f16_wmma plugin: bf16 cache built when it serves, cuBLAS products against float64 math.

Oracle: ``gguf.quants.dequantize`` and a float64 product. Tolerance: the cache and the
activation are rounded to bf16 (8-bit mantissa, relative rounding <= 2^-9 each), products
accumulate in float32: ``|y - ref| <= 1e-2 * sum |x w|`` bounds the two roundings (~4e-3 worst
case, ~1e-3 typical). F32 weights are used as they are: float32 tolerance (1e-5).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minfer_core.quants import info  # noqa: E402
from minfer_core.weights import Activation, LoadContext, Weight  # noqa: E402
from minfer_f16_wmma import cache, plugin  # noqa: E402

F16_FIELDS = {QT.Q4_K: (0, 2), QT.Q6_K: (208,), QT.Q5_0: (0,), QT.Q8_0: (0,), QT.Q4_1: (0, 2), QT.Q3_K: (108,)}


def random_raw(qtype, n, k, gen, device="cpu"):
    q = info(qtype)
    nb = k // q.block_size
    raw = torch.randint(0, 256, (n, nb, q.type_size), dtype=torch.uint8, generator=gen, device=device)
    for off in F16_FIELDS[qtype]:
        v = (torch.rand(n, nb, generator=gen, device=device) * 0.02 + 1e-3).half()
        raw[:, :, off:off + 2] = v.view(torch.uint8).reshape(n, nb, 2)
    return raw.reshape(n, -1)


def ctx(mmq: bool = True, device="cpu") -> LoadContext:
    return LoadContext(torch.device(device), None, {"MINFER_MMQ": mmq})


def err(y, x, w64, bias=None) -> float:
    x64 = x.double().to(w64.device)
    ref = x64 @ w64.T + (bias.double() if bias is not None else 0)
    return ((y.double() - ref).abs() / (x64.abs() @ w64.abs().T + 1e-30)).max().item()


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda t: t.name)
def test_prefill_and_decode_match_dequantized_math(qtype):
    gen = torch.Generator().manual_seed(int(qtype))
    n, k = 24, 512
    w = Weight("w", qtype, (n, k), random_raw(qtype, n, k, gen), "o", torch.randn(n, generator=gen))
    w64 = torch.from_numpy(gguf_quants.dequantize(w.raw.numpy(), qtype)).double()
    (pre,) = plugin.minfer_matmul_candidates(w, "prefill", ctx())
    (dec,) = plugin.minfer_matmul_candidates(w, "decode", ctx())
    assert (pre.plugin, pre.label, dec.label) == ("f16_wmma", "f16.gemm", "f16.gemv")
    x = torch.randn(20, k, generator=gen)
    assert err(pre.fn(Activation(x)), x, w64, w.bias) < 1e-2
    assert err(pre.fn(Activation(None, x.to(torch.bfloat16))), x, w64, w.bias) < 1e-2  # fuse mode 2: plane only
    assert err(dec.fn(x[:1]), x[:1], w64, w.bias) < 1e-2


def test_f32_weight_served_in_f32():
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(8, 64, generator=gen)
    w = Weight("f", QT.F32, (8, 64), w32.view(torch.uint8).reshape(8, -1).clone())
    (dec,) = plugin.minfer_matmul_candidates(w, "decode", ctx())
    x = torch.randn(2, 64, generator=gen)
    assert err(dec.fn(x), x, w32.double()) < 1e-5


def test_cache_built_at_registration_only_when_mmq_is_off():
    gen = torch.Generator().manual_seed(1)
    on = Weight("a", QT.Q8_0, (4, 64), random_raw(QT.Q8_0, 4, 64, gen))
    plugin.minfer_register_weight(on, ctx(mmq=True))
    assert cache.KEY not in on.planes  # mmq serves prefill: nothing built yet
    (dec,) = plugin.minfer_matmul_candidates(on, "decode", ctx(mmq=True))
    dec.fn(torch.randn(1, 64, generator=gen))
    assert on.planes[cache.KEY].dtype == torch.bfloat16  # built on first use, then kept
    off = Weight("b", QT.Q8_0, (4, 64), random_raw(QT.Q8_0, 4, 64, gen))
    plugin.minfer_register_weight(off, ctx(mmq=False))
    assert off.planes[cache.KEY].shape == (4, 64)


def test_offers_by_type_even_when_only_planning():
    (c,) = plugin.minfer_matmul_candidates(Weight("x", QT.Q4_K, (4, 256), None), "decode", ctx())
    assert c.label == "f16.gemv"
    assert plugin.minfer_matmul_candidates(Weight("y", QT.TQ1_0, (4, 256), None), "decode", ctx()) is None
    assert "CUDA" in plugin.minfer_applicable(ctx())


@pytest.mark.cuda
@pytest.mark.parametrize("qtype,n,k", [(QT.Q4_K, 4608, 3584), (QT.Q6_K, 152064, 3584), (QT.Q5_0, 896, 896)],
                         ids=str)
def test_real_shapes_cuda(qtype, n, k):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(n)
    w = Weight("w", qtype, (n, k), random_raw(qtype, n, k, gen, "cuda"))
    assert plugin.minfer_applicable(ctx(device="cuda")) is None
    plugin.minfer_register_weight(w, ctx(mmq=False, device="cuda"))
    w64 = dequantize(w.raw, qtype, k).double()
    for phase, m in (("prefill", 64), ("decode", 1)):
        (c,) = plugin.minfer_matmul_candidates(w, phase, ctx(device="cuda"))
        x = torch.randn(m, k, generator=gen, device="cuda")
        assert err(c.fn(Activation(x) if phase == "prefill" else x), x, w64) < 1e-2
