"""Fused producers against torch: f32 outputs to float32 rounding, planes to bf16 rounding."""

import pytest
import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(16, 96), (17, 200)] + ([(3314, 3584)] if DEV == "cuda" else [])


@pytest.mark.parametrize("m,k", SHAPES)
@pytest.mark.parametrize("write_f32", [True, False])
def test_rmsnorm(m, k, write_f32):
    from minfer_mmq_triton.ops.producers import rmsnorm

    x = torch.randn(m, k, device=DEV) * 3
    w = torch.randn(k, device=DEV)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    act = rmsnorm(x, w, 1e-6, write_f32)
    assert (act.f32 is not None) == write_f32 and act.plane.dtype == torch.bfloat16
    if write_f32:
        torch.testing.assert_close(act.f32, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(act.plane.float(), ref, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("write_f32", [True, False])
def test_swiglu(m, f, write_f32):
    from minfer_mmq_triton.ops.producers import swiglu

    gu = torch.randn(m, 2 * f, device=DEV) * 3
    ref = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
    act = swiglu(gu, write_f32)
    assert (act.f32 is not None) == write_f32 and act.plane.shape == (m, f)
    if write_f32:
        torch.testing.assert_close(act.f32, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(act.plane.float(), ref, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("m,f", SHAPES)
def test_swiglu_reads_bf16(m, f):
    """A bf16 ``[g | u]`` (a gate|up matmul's ``out_bf16`` product) gives the float32 SwiGLU of
    its bf16 values."""
    from minfer_mmq_triton.ops.producers import swiglu

    gu = (torch.randn(m, 2 * f, device=DEV) * 3).to(torch.bfloat16)
    g, u = gu.float().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(g) * u
    act = swiglu(gu, True)
    torch.testing.assert_close(act.f32, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(act.plane.float(), ref, rtol=2 ** -7, atol=1e-3)


def test_prepass():
    from minfer_mmq_triton.ops.producers import prepass

    x = torch.randn(17, 64, device=DEV)
    act = prepass(x)
    assert act.f32 is x and torch.equal(act.plane, x.to(torch.bfloat16))
