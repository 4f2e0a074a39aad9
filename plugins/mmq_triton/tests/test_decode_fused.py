"""Fused decode kernels (RMSNorm, RoPE + KV-cache write) against plain torch float64 math.

Tolerances: float32 results within rtol 1e-5 (reduction order and fused multiply-adds differ);
float16 cache rows within one float16 ulp of the float64 reference rounded by torch's ``.half()``
(v, only converted, must match exactly). Cache rows other than ``pos`` must stay bit-identical.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minfer_mmq_triton.ops.norm import rmsnorm_row  # noqa: E402
from minfer_mmq_triton.ops.rope import rope_kv_write  # noqa: E402

HEADS = [(4, 2, 64), (14, 2, 64), (28, 4, 128)]  # (n_heads, n_kv, D)
N_CTX = 16


# -- references ------------------------------------------------------------------------------------

def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def ref_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x (heads, D); cos/sin (D/2,), all float64."""
    d = x.shape[-1]
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


def rope_row(position: int, d: int, device, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, D/2) float32 for one position, as a model would build them."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (position * inv)[None]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def assert_f16_within_ulp(got: torch.Tensor, want64: torch.Tensor) -> None:
    want = want64.cpu().half().abs()
    ulp = (torch.nextafter(want, torch.tensor(float("inf"), dtype=torch.float16)) - want).float()
    err = (got.cpu().float() - want64.cpu().half().float()).abs()
    assert (err <= ulp).all(), f"max err {err.max().item()} vs ulp"


# -- shared checks ---------------------------------------------------------------------------------

def check_rmsnorm(m: int, e: int, device: str) -> None:
    gen = torch.Generator().manual_seed(m * 10007 + e)
    x = (torch.randn(m, e, generator=gen) * 3 + 0.5).to(device)
    w = torch.randn(e, generator=gen).to(device)
    out = rmsnorm_row(x, w, 1e-6)
    assert out.shape == (m, e) and out.dtype == torch.float32
    torch.testing.assert_close(out.double().cpu(), ref_rmsnorm(x, w, 1e-6).cpu(), rtol=1e-5, atol=1e-6)


def check_rope_kv(h: int, hkv: int, d: int, pos: int, neox: bool, device: str) -> None:
    gen = torch.Generator().manual_seed(h * 131 + d + pos + neox)
    n = h * d + 2 * hkv * d
    big = torch.randn(2, n, generator=gen).to(device)  # q starts mid-tensor, like a fused qkv row
    q, k, v = big[1].split([h * d, hkv * d, hkv * d])
    q_before = q.clone()
    cos, sin = rope_row(pos + 3, d, device)
    k_cache = torch.randn(N_CTX, hkv, d, generator=gen).half().to(device)
    v_cache = torch.randn(N_CTX, hkv, d, generator=gen).half().to(device)
    k_old, v_old = k_cache.clone(), v_cache.clone()
    pos_t = torch.tensor([pos], dtype=torch.int64, device=device)

    q_rot = rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, pos_t, neox)

    c64, s64 = cos[0].double(), sin[0].double()
    want_q = ref_rope(q.double().view(h, d), c64, s64, neox)
    want_k = ref_rope(k.double().view(hkv, d), c64, s64, neox)
    assert q_rot.shape == (h, d) and q_rot.dtype == torch.float32
    assert q_rot.data_ptr() != q.data_ptr() and torch.equal(q, q_before)
    torch.testing.assert_close(q_rot.double(), want_q, rtol=1e-5, atol=1e-6)
    assert_f16_within_ulp(k_cache[pos], want_k)
    assert torch.equal(v_cache[pos], v.view(hkv, d).half())
    others = torch.arange(N_CTX, device=device) != pos
    assert torch.equal(k_cache[others], k_old[others])
    assert torch.equal(v_cache[others], v_old[others])


# -- CPU (Triton interpreter without CUDA) ---------------------------------------------------------

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("e", [256, 896, 3584])
def test_rmsnorm_row(m, e):
    check_rmsnorm(m, e, DEV)


def test_rmsnorm_row_strided_rows():
    x = torch.randn(3, 512, device=DEV)[:, :256]  # row stride 512
    w = torch.randn(256, device=DEV)
    torch.testing.assert_close(rmsnorm_row(x, w, 1e-5).double(), ref_rmsnorm(x, w, 1e-5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("h,hkv,d", HEADS)
@pytest.mark.parametrize("pos", [0, 7])
@pytest.mark.parametrize("neox", [True, False])
def test_rope_kv_write(h, hkv, d, pos, neox):
    check_rope_kv(h, hkv, d, pos, neox, DEV)


def test_rope_styles_differ():
    """Guards the oracle: the two pairings give different rotations for the same input."""
    x = torch.randn(2, 64, dtype=torch.float64)
    c, s = (t[0].double() for t in rope_row(5, 64, "cpu"))
    assert not torch.allclose(ref_rope(x, c, s, True), ref_rope(x, c, s, False))


def test_rope_kv_write_rejects_bad_cache():
    q, k, v = torch.randn(256), torch.randn(128), torch.randn(128)
    cos, sin = rope_row(0, 64, "cpu")
    bad = torch.zeros(4, 2, 64)  # float32 cache
    with pytest.raises(ValueError):
        rope_kv_write(q, k, v, cos, sin, bad, bad, torch.zeros(1, dtype=torch.int64), True)


# -- GPU -------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("m", [1, 3, 15])
@pytest.mark.parametrize("e", [256, 896, 3584, 8192])
def test_rmsnorm_row_cuda(m, e):
    check_rmsnorm(m, e, "cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("h,hkv,d", HEADS)
@pytest.mark.parametrize("pos", [0, 7])
@pytest.mark.parametrize("neox", [True, False])
def test_rope_kv_write_cuda(h, hkv, d, pos, neox):
    check_rope_kv(h, hkv, d, pos, neox, "cuda")


@pytest.mark.cuda
def test_rope_kv_write_replays_in_a_cuda_graph_at_a_new_pos():
    h, hkv, d = 28, 4, 128
    qkv = torch.randn(h * d + 2 * hkv * d, device="cuda")
    q, k, v = qkv.split([h * d, hkv * d, hkv * d])
    cos, sin = rope_row(9, d, "cuda")
    k_cache = torch.zeros(N_CTX, hkv, d, dtype=torch.float16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    pos = torch.tensor([1], dtype=torch.int64, device="cuda")
    rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, pos, True)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q_rot = rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, pos, True)
    k_cache.zero_()
    v_cache.zero_()
    pos.fill_(11)
    g.replay()
    torch.cuda.synchronize()
    c64, s64 = cos[0].double(), sin[0].double()
    torch.testing.assert_close(q_rot.double(), ref_rope(q.double().view(h, d), c64, s64, True),
                               rtol=1e-5, atol=1e-6)
    assert_f16_within_ulp(k_cache[11], ref_rope(k.double().view(hkv, d), c64, s64, True))
    assert torch.equal(v_cache[11], v.view(hkv, d).half())
    assert not k_cache[:11].any() and not k_cache[12:].any() and not v_cache[1].any()


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("t", [5, 37])
def test_prefill_rope_kv_rows_match_the_reference(neox, t):
    """The prefill's fused RoPE + KV write against the reference backend's torch version, on rows
    that are strided views of a fused qkv output, written at a non-zero start; fewer rows than one
    program's block, and several blocks with a partial last one."""
    from minfer_core.reference import rope_kv_rows as ref_rows
    from minfer_mmq_triton.ops.rope import rope_kv_rows

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(4)
    h, hkv, d, start, n_ctx = 4, 2, 16, 3, t + 7
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dev)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([h * d, hkv * d, hkv * d], dim=-1))
    ang = torch.rand(t, d // 2, generator=g) * 6
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)
    caches = [torch.zeros(n_ctx, hkv, d, dtype=torch.float16, device=dev) for _ in range(4)]
    want = ref_rows(q, k, v, cos, sin, caches[0], caches[1], start, neox)
    got = rope_kv_rows(q, k, v, cos, sin, caches[2], caches[3], start, neox)
    assert got.shape == (t, h, d) and torch.allclose(got, want, atol=1e-5)
    assert torch.equal(caches[2], caches[0]) or torch.allclose(caches[2].float(), caches[0].float(), atol=1e-3)
    assert torch.equal(caches[3], caches[1])
    assert caches[2][:start].abs().sum() == 0 and caches[2][start + t:].abs().sum() == 0


def test_rope_kv_rows_at_scattered_pool_rows():
    """Per-token cache rows (a batch's pool slots, in no order): rotated k and v land in exactly
    those rows, as the reference's torch version puts them; every other row stays untouched."""
    from minfer_core.reference import rope_kv_rows as ref_rows
    from minfer_mmq_triton.ops.rope import rope_kv_rows

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(5)
    t, h, hkv, d, n_rows = 4, 4, 2, 16, 20
    q, k, v = (torch.randn(t, n, d, generator=g).to(dev) for n in (h, hkv, hkv))
    ang = torch.rand(t, d // 2, generator=g) * 6
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)
    rows = torch.tensor([17, 2, 9, 3], device=dev)
    caches = [torch.zeros(n_rows, hkv, d, dtype=torch.float16, device=dev) for _ in range(4)]
    want = ref_rows(q, k, v, cos, sin, caches[0], caches[1], rows, True)
    got = rope_kv_rows(q, k, v, cos, sin, caches[2], caches[3], rows, True)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(caches[2].float(), caches[0].float(), atol=1e-3) and torch.equal(caches[3], caches[1])
    others = [r for r in range(n_rows) if r not in rows.tolist()]
    assert not caches[2][others].any() and not caches[3][others].any() and caches[3][rows].any()
