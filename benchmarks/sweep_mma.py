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
#: q6_K: (N, K, role, prologue), configs (tiles, blocks a step, warps)
Q6_SHAPES = [(3584, 18944, "down", "swiglu"), (152064, 3584, "output", "norm")]
Q6_MMA = [(1, 1, 4), (2, 1, 4), (1, 2, 4), (1, 1, 2), (1, 1, 8), (2, 2, 4), (1, 4, 4)]
ROTATE = 256 << 20


def sweep(qt, shapes, configs, splits_for, seed: int) -> None:
    """Time the dp4a default and every MMA config ``(tiles, step, warps[, lookahead])`` at each shape."""
    from minfer_mmq_triton import decode, gemv_mma
    from minfer_mmq_triton.gemv_split import SplitScratch

    mma_fn = gemv_mma.gemv_q4p_mma if qt == QT.Q4_K else gemv_mma.gemv_q6k_mma
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for n, k, role, pro in shapes:
        w0 = make_weight(qt, n, k, gen, device="cuda")
        nbytes = w0.raw.numel()
        copies = max(2, min(16, -(-ROTATE // nbytes)))
        ws = [w0] + [make_weight(qt, n, k, gen, device="cuda") for _ in range(copies - 1)]
        datas = [decode.prepare(w) for w in ws]
        for w in ws:
            w.raw = None
        torch.cuda.empty_cache()
        x = torch.randn(1, 2 * k if pro == "swiglu" else k, generator=gen, device="cuda")
        res = torch.randn(1, n, generator=gen, device="cuda")
        kw = {"norm": (torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6)} if pro == "norm" else \
            {"swiglu": True, "residual": res}
        reps = max(1, 8 // copies)
        default = decode.decode_config(qt, n, k, role)
        fns = [decode.make_gemv(qt, d, None, n, k, default, pdl=True) for d in datas]
        rows = [(_graph_time([lambda f=f: f(x, **kw) for f in fns] * reps), f"triton {default}")]
        for cfg in configs:
            tiles, step, warps = cfg[:3]
            extra = {"lookahead": bool(cfg[3])} if len(cfg) > 3 else {}
            for split in splits_for(n):
                bn = gemv_mma.mma_rows(tiles, warps)
                try:
                    scr = [SplitScratch(n, bn, split) for _ in datas]
                    fns = [lambda d=d, sc=sc: mma_fn(x, d, None, tiles, step, warps, split, sc, pdl=True, **extra,
                                                     **kw) for d, sc in zip(datas, scr)]
                    t = _graph_time(fns * reps)
                except Exception as e:  # a config the compiler rejects: report and go on
                    print(f"  mma {cfg + (split,)} failed {type(e).__name__}: {str(e).splitlines()[0][:120]}",
                          flush=True)
                    continue
                ahead = f" ahead={cfg[3]}" if len(cfg) > 3 else ""
                rows.append((t, f"mma T={tiles} S={step} warps={warps}{ahead} split={split} (BN {bn})"))
        print(f"\n## {qt.name} {n}x{k} ({role}, {pro}, {nbytes / 2**20:.1f} MiB, {copies} copies)")
        for t, label in sorted(rows):
            print(f"  {t * 1e6:7.2f} us  {nbytes / t / 1e9:6.0f} GB/s  {label}", flush=True)
        del ws, datas, fns
        torch.cuda.empty_cache()


def main() -> None:
    if "--q6" in sys.argv:
        sweep(QT.Q6_K, Q6_SHAPES, Q6_MMA, lambda n: [1] if n > 16384 else [2, 4, 8], seed=1)
    else:
        sweep(QT.Q4_K, SHAPES, MMA, lambda n: [1] if n > 8192 else [4, 8], seed=0)


if __name__ == "__main__":
    main()
