"""Planes: the documented layout (read back here with plain torch, from the docstring alone) must
reproduce gguf's own dequantization; the plane-expanding kernels must match it too.

Tolerances: the q4_K plane holds the GGUF's own fields (exact: read in float32 it equals the
oracle up to float32 rounding, bound 1e-6); q6_K plane scales are float16 ``d * scale`` (11
significant bits), within ~2^-11 of the oracle (bound 1e-3 relative). A kernel writes bfloat16 (8 significant bits): the
per-element error is <= 2^-8 relative with round-to-nearest (GPU) and <= 2^-7 with the CPU
interpreter's truncation, hence Frobenius bound 6e-3 and max bound 1e-2 (relative to max |W|).
"""

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from mmq_synth import oracle, rel_err


def read_q4k(p) -> torch.Tensor:
    n, k = p.qs.shape[0], p.qs.shape[1] * 2
    b = p.qs.reshape(n, k // 128, 64)
    q = torch.cat([b & 15, b >> 4], dim=2).reshape(n, k).float()
    d = p.dm[..., 0].float().repeat_interleave(256, dim=1)
    dmin = p.dm[..., 1].float().repeat_interleave(256, dim=1)
    s = p.sc[..., 0].float().repeat_interleave(32, dim=1)
    m = p.sc[..., 1].float().repeat_interleave(32, dim=1)
    return (d * s) * q - dmin * m


def read_q6k(p) -> torch.Tensor:
    n, k = p.ql.shape[0], p.ql.shape[1] * 2
    b = p.ql.reshape(n, k // 128, 64)
    lo = torch.cat([b & 15, b >> 4], dim=2).reshape(n, k)
    h = p.qh.reshape(n, k // 256, 1, 64)
    hi = torch.cat([(h >> (2 * f)) & 3 for f in range(4)], dim=2).reshape(n, k)
    q = (lo | (hi << 4)).float() - 32
    return p.sc.float().repeat_interleave(16, dim=1) * q


READERS = {QT.Q4_K: read_q4k, QT.Q6_K: read_q6k}


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
def test_plane_layout_matches_gguf(qt):
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.synth import random_raw

    n, k = 33, 768
    raw = random_raw(qt, n, k, "cpu", seed=3)
    key, build = planes.BUILDERS[qt]
    p = build(raw, k)
    fro, mx = rel_err(READERS[qt](p), oracle(raw, qt, k))
    bound = 1e-6 if qt == QT.Q4_K else 1e-3
    assert fro < bound and mx < bound, (fro, mx)
    assert p.nbytes() * 8 / (n * k) == (4.625 if qt == QT.Q4_K else 7.0)


def test_q4k_plane_is_exact_where_float16_products_would_overflow():
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.synth import random_raw

    raw = random_raw(QT.Q4_K, 4, 256, "cpu", seed=1)
    raw[0, 0:2] = torch.tensor([60000.0], dtype=torch.float16).view(torch.uint8)
    raw[0, 4:16] = 0x3F  # every 6-bit scale 63: d * sc = 3.8e6, beyond float16
    fro, mx = rel_err(read_q4k(planes.build_q4k(raw, 256)), oracle(raw, QT.Q4_K, 256))
    assert fro < 1e-6 and mx < 1e-6, (fro, mx)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K])
@pytest.mark.parametrize("k", [512, 768])  # 768: 6 spans, no whole number of 4-span q4_K programs
def test_dequant_plane_kernel(qt, k):
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill import gemm_planes
    from minfer_mmq_triton.synth import random_raw

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 40
    raw = random_raw(qt, n, k, dev, seed=5)
    p = planes.BUILDERS[qt][1](raw, k)
    out = torch.full((n, k), float("nan"), dtype=torch.bfloat16, device=dev)
    gemm_planes.dequant_plane(p, k, out)
    fro, mx = rel_err(out, oracle(raw, qt, k))
    assert fro < 6e-3 and mx < 1e-2, (fro, mx)
    # a row slice lands in the right place
    part = torch.full((7, k), float("nan"), dtype=torch.bfloat16, device=dev)
    gemm_planes.dequant_plane(p, k, part, 30, 37)
    assert torch.equal(part, out[30:37])


@pytest.mark.cuda
@pytest.mark.parametrize("large", [False, True])
def test_q4k_bf16_decode_against_the_oracle(large):
    """q4_K decoded in bf16x2 arithmetic (the fused GEMM from 32-row tiles; the expansion on
    request) against gguf's dequantizer, with the float32 decode's bounds: the scale and min are
    rounded to bf16 before the packed fma, so each value carries up to two bf16 roundings; ``large``:
    ``d * sc`` beyond float16's range, which bf16 still holds."""
    from minfer_mmq_triton import planes
    from minfer_mmq_triton.prefill import gemm_planes
    from minfer_mmq_triton.synth import random_raw

    n, k = 40, 768
    raw = random_raw(QT.Q4_K, n, k, "cpu", seed=9)
    if large:
        raw[::3, 0:2] = torch.tensor([60000.0], dtype=torch.float16).view(torch.uint8)
        raw[::3, 4:16] = 0x3F
    raw = raw.cuda()
    out = torch.full((n, k), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_planes.dequant_plane(planes.build_q4k(raw, k), k, out, packed=True)
    fro, mx = rel_err(out, oracle(raw, QT.Q4_K, k))
    assert fro < 6e-3 and mx < 1e-2, (fro, mx)
