"""The 7B's int8 decode GEMVs: the dp4a Triton kernels (``gemv_q4plane``, ``gemv_q8dot``) against
the tensor-core ones (``gemv_mma``) over a grid of configs (GPU).

    python benchmarks/sweep_mma.py [--q6]

Each config runs as a chain of calls over rotating weight copies in one CUDA graph, launched with
PDL and with the prologue the model uses (RMSNorm for qkv and gate|up, SwiGLU + residual for
ffn_down), as ``sweep_small.py`` does. Prints microseconds per call and GB/s of weight bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "mmq_triton" / "tests"))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from test_decode_bench import _graph_time  # noqa: E402
from test_decode_gemv import make_weight  # noqa: E402

SHAPES = [(37888, 3584, "gate_up", "norm"), (3584, 18944, "down", "swiglu"), (4608, 3584, "qkv", "norm")]
#: q4_K: (tiles, spans, warps, lookahead)
MMA = [(1, 2, 4, 0), (1, 2, 4, 1), (1, 4, 4, 0), (1, 4, 4, 1), (2, 2, 4, 1), (1, 2, 2, 1), (1, 2, 8, 1)]
ROTATE = 256 << 20


#: q6_K: (N, K, role, prologue), configs (tiles, blocks a step, warps)
Q6_SHAPES = [(3584, 18944, "down", "swiglu"), (152064, 3584, "output", "norm")]
Q6_MMA = [(1, 1, 4), (2, 1, 4), (1, 2, 4), (1, 1, 2), (1, 1, 8), (2, 2, 4), (1, 4, 4)]


def sweep_q6() -> None:
    from minfer_mmq_triton import decode, gemv_mma
    from minfer_mmq_triton.gemv_split import SplitScratch

    gen = torch.Generator(device="cuda").manual_seed(1)
    for n, k, role, pro in Q6_SHAPES:
        w0 = make_weight(QT.Q6_K, n, k, gen, device="cuda")
        nbytes = w0.raw.numel()
        copies = max(2, min(16, -(-ROTATE // nbytes)))
        ws = [w0] + [make_weight(QT.Q6_K, n, k, gen, device="cuda") for _ in range(copies - 1)]
        datas = [decode.prepare(w) for w in ws]
        for w in ws:
            w.raw = None
        torch.cuda.empty_cache()
        x = torch.randn(1, 2 * k if pro == "swiglu" else k, generator=gen, device="cuda")
        res = torch.randn(1, n, generator=gen, device="cuda")
        kw = {"norm": (torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6)} if pro == "norm" else \
            {"swiglu": True, "residual": res}
        default = decode.decode_config(QT.Q6_K, n, k, role)
        fns = [decode.make_gemv(QT.Q6_K, d, None, n, k, default, pdl=True) for d in datas]
        rows = [(_graph_time([lambda f=f: f(x, **kw) for f in fns] * max(1, 8 // copies)), f"triton {default}")]
        for tiles, s, warps in Q6_MMA:
            for split in ([1] if n > 16384 else [2, 4, 8]):
                bn = gemv_mma.mma_rows(tiles, warps)
                try:
                    scr = [SplitScratch(n, bn, split) for _ in datas]
                    fns = [lambda d=d, sc=sc: gemv_mma.gemv_q6k_mma(x, d, None, tiles, s, warps, split, sc, pdl=True,
                                                                      **kw) for d, sc in zip(datas, scr)]
                    t = _graph_time(fns * max(1, 8 // copies))
                except Exception as e:
                    print(f"  q6 mma {(tiles, s, warps, split)} failed {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}", flush=True)
                    continue
                rows.append((t, f"mma T={tiles} S={s} warps={warps} split={split} (BN {bn})"))
        print(f"\n## q6_K {n}x{k} ({role}, {pro}, {nbytes / 2**20:.1f} MiB, {copies} copies)")
        for t, label in sorted(rows):
            print(f"  {t * 1e6:7.2f} us  {nbytes / t / 1e9:6.0f} GB/s  {label}", flush=True)
        del ws, datas, fns
        torch.cuda.empty_cache()


def main() -> None:
    if "--q6" in sys.argv:
        return sweep_q6()
    from minfer_mmq_triton import decode, gemv_mma
    from minfer_mmq_triton.gemv_split import SplitScratch

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k, role, pro in SHAPES:
        w0 = make_weight(QT.Q4_K, n, k, gen, device="cuda")
        nbytes = w0.raw.numel()
        copies = max(2, min(16, -(-ROTATE // nbytes)))
        ws = [w0] + [make_weight(QT.Q4_K, n, k, gen, device="cuda") for _ in range(copies - 1)]
        datas = [decode.prepare(w) for w in ws]
        for w in ws:
            w.raw = None
        torch.cuda.empty_cache()
        x = torch.randn(1, 2 * k if pro == "swiglu" else k, generator=gen, device="cuda")
        res = torch.randn(1, n, generator=gen, device="cuda")
        kw = {"norm": (torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6)} if pro == "norm" else \
            {"swiglu": True, "residual": res}
        default = decode.decode_config(QT.Q4_K, n, k, role)
        rows = []
        fns = [decode.make_gemv(QT.Q4_K, d, None, n, k, default, pdl=True) for d in datas]
        t = _graph_time([lambda f=f: f(x, **kw) for f in fns] * max(1, 8 // copies))
        rows.append((t, f"triton {default}"))
        splits = [1] if n > 8192 else [4, 8]
        for tiles, s, warps, ahead in MMA:
            for split in splits:
                bn = gemv_mma.mma_rows(tiles, warps)
                try:
                    scr = [SplitScratch(n, bn, split) for _ in datas]
                    fns = [lambda d=d, sc=sc: gemv_mma.gemv_q4p_mma(x, d, None, tiles, s, warps, split, sc,
                                                                       pdl=True, lookahead=bool(ahead), **kw)
                           for d, sc in zip(datas, scr)]
                    t = _graph_time(fns * max(1, 8 // copies))
                except Exception as e:
                    print(f"  mma {(tiles, s, warps, ahead, split)} failed {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}", flush=True)
                    continue
                rows.append((t, f"mma T={tiles} S={s} warps={warps} ahead={ahead} split={split} (BN {bn})"))
        print(f"\n## q4_K {n}x{k} ({role}, {pro}, {nbytes / 2**20:.1f} MiB, {copies} copies)")
        for t, label in sorted(rows):
            print(f"  {t * 1e6:7.2f} us  {nbytes / t / 1e9:6.0f} GB/s  {label}", flush=True)
        del ws, datas, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
