"""A q4_K and a q6_K weight over one input in one launch (``pair_mma``; GPU): each part against gguf's
dequantized weights, and bit for bit what the part's own kernel gives at the same tiling and split (the
same program code), with biases, the RMSNorm applied by the quantizer, 1 and 3 activation rows, short and
empty splits, through the split scratch and (compute capability 9.0+) inside clusters."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from test_decode_gemv import TOL_I8, check, make_weight, oracle_dense

pytestmark = pytest.mark.cuda


def _hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


#: (q4_K rows, q6_K rows, K, split): the 7B's q|k and v at the model's split; small ones whose q6_K part has
#: a short split and an empty one (5 blocks over 4 splits of 2), and a q4_K part that is not whole programs
CASES = [(4096, 512, 3584, 7), (200, 64, 1280, 4), (72, 40, 768, 2)]


@pytest.mark.parametrize("n4,n6,k,split", CASES, ids=str)
@pytest.mark.parametrize("cluster", [False, True], ids=["scratch", "cluster"])
def test_pair_matches_gguf_and_each_part_s_own_kernel(n4, n6, k, split, cluster):
    if cluster and not _hopper():
        pytest.skip("thread-block clusters need compute capability 9.0+")
    from minfer_mmq_triton import decode, tiles
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.pair_mma import gemv_pair_mma
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    gen = torch.Generator(device="cuda").manual_seed(n4 + n6 + k)
    w4 = make_weight(QT.Q4_K, n4, k, gen, bias=True, device="cuda")
    w6 = make_weight(QT.Q6_K, n6, k, gen, bias=True, device="cuda")
    p4, p6 = decode.prepare(w4), decode.prepare(w6)
    warps, spans = tiles.MMA_WARPS, 4
    t6, blocks6, ahead6 = tiles.PAIR_Q6K
    bn = 16 * warps
    s = [SplitScratch(n, bn, 1 if cluster else split) for n in (n4, n6)]
    nw = torch.rand(k, generator=gen, device="cuda") + 0.5
    for m in (1, 3):
        x = torch.randn(m, k, generator=gen, device="cuda") * 2
        for norm in (None, (nw, 1e-6)):
            y = gemv_pair_mma(x, p4, w4.bias, p6, w6.bias, (1, spans, 0), (t6, blocks6, ahead6), warps, split, *s,
                              norm=norm, pdl=cluster, cluster=cluster)
            y4 = gemv_q4p_mma(x, p4, w4.bias, 1, spans, warps, split, s[0], norm=norm, pdl=cluster, cluster=cluster)
            y6 = gemv_q6k_mma(x, p6, w6.bias, t6, blocks6, warps, split, s[1], norm=norm, pdl=cluster,
                              cluster=cluster, lookahead=bool(ahead6))
            assert torch.equal(y[:, :n4], y4) and torch.equal(y[:, n4:], y6), f"M={m} norm={norm is not None}"
            xn = x if norm is None else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw
            for part, w in ((y4, w4), (y6, w6)):
                err = check(part, xn, oracle_dense(w.raw, w.qtype).cuda(), w.bias)
                assert err < TOL_I8, f"{QT(w.qtype).name} M={m} norm={norm is not None}: {err:.2e}"
    if not cluster:  # the arrival counters are back at zero
        assert all(int(sc.get(3, "cuda")[1].abs().sum()) == 0 for sc in s)
