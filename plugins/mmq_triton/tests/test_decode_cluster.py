"""The split tensor-core GEMVs reduced inside a thread-block cluster (``launch.cluster``; GPU, compute
capability 9.0+): against gguf's dequantized weights, and bit for bit what the same kernels give through
the split scratch and its arrival counter (the same partials added in the same order), with bias,
residual, several activation rows, uneven and empty splits, and in a CUDA graph under PDL."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from test_decode_gemv import TOL_I8, check, make_weight, oracle_dense

pytestmark = pytest.mark.cuda


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


#: (type, n, k, split, (tiles, steps a program's step, warps, lookahead), bias): 7B shapes at the split and
#: tiling they run (``tiles.mma_config``; ``None``), o at 8 splits (the last one empty) and the q6_K down at its
#: earlier tiling too, and small ones whose last split is short (q4_K 10 spans over 4 splits of 4) or empty (14
#: spans, 8 splits of 2)
CASES = [(QT.Q4_K, 3584, 3584, 7, None, False), (QT.Q4_K, 4608, 3584, 7, None, True),
         (QT.Q4_K, 3584, 3584, 8, (1, 4, 4, 0), False),
         (QT.Q4_K, 3584, 18944, 8, None, False), (QT.Q6_K, 3584, 18944, 8, None, False),
         (QT.Q6_K, 3584, 18944, 8, (2, 2, 4, 0), False), (QT.Q4_K, 200, 1280, 4, (1, 4, 4, 0), True),
         (QT.Q4_K, 70, 1792, 8, (1, 2, 4, 0), False), (QT.Q6_K, 150, 2560, 4, (1, 2, 4, 1), True)]


def _gemv(w, tiling, split):
    from minfer_mmq_triton import decode, tiles
    from minfer_mmq_triton.launch.mma import mma_rows
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    if tiling is None:  # what the model runs at this shape
        bn, steps, warps, _, run_split, ahead = tiles.mma_config(w.qtype, w.n_out, w.n_in)
        assert run_split == split
        tiling = (bn // (16 * warps), steps, warps, ahead)
    t, steps, warps, ahead = tiling
    data = decode.prepare(w)
    scratch = SplitScratch(w.n_out, mma_rows(t, warps), split)
    gemv = gemv_q4p_mma if QT(w.qtype) == QT.Q4_K else gemv_q6k_mma

    def fn(x, cluster, residual=None):
        return gemv(x, data, w.bias, t, steps, warps, split, scratch, residual, pdl=True, cluster=cluster,
                    lookahead=bool(ahead))

    return fn


@pytest.mark.skipif(not _hopper(), reason="thread-block clusters need compute capability 9.0+")
@pytest.mark.parametrize("qtype,n,k,split,tiling,bias", CASES, ids=str)
def test_cluster_split_gemv_matches_gguf_and_the_scratch_bit_for_bit(qtype, n, k, split, tiling, bias):
    from minfer_core.dequant import dequantize

    gen = torch.Generator(device="cuda").manual_seed(n + k + split)
    w = make_weight(qtype, n, k, gen, bias=bias, device="cuda")
    w64 = oracle_dense(w.raw, qtype).cuda() if n * k < 1e6 else dequantize(w.raw, qtype, k).double()
    fn = _gemv(w, tiling, split)
    for m in (1, 3):
        x = torch.randn(m, k, generator=gen, device="cuda") * 2
        y = fn(x, cluster=True)
        assert check(y, x, w64, w.bias) < TOL_I8, f"{qtype.name} {n}x{k} M={m}"
        assert torch.equal(y, fn(x, cluster=False))
        if not bias:
            res = torch.randn(m, n, generator=gen, device="cuda")
            assert torch.equal(fn(x, cluster=True, residual=res), fn(x, cluster=False, residual=res))


@pytest.mark.skipif(not _hopper(), reason="thread-block clusters need compute capability 9.0+")
def test_cluster_split_gemv_replays_in_a_cuda_graph():
    gen = torch.Generator(device="cuda").manual_seed(5)
    w = make_weight(QT.Q4_K, 3584, 3584, gen, device="cuda")
    fn = _gemv(w, None, 7)
    x = torch.randn(1, 3584, generator=gen, device="cuda")
    want = fn(x, cluster=False).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(x, cluster=True)
    for _ in range(3):
        y.zero_()
        graph.replay()
        assert torch.equal(y, want)
