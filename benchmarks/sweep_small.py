"""Sweep tiles and splits of the short decode GEMVs as the decode step runs them (GPU).

    python benchmarks/sweep_small.py [--only 05b|7b]

Small matrices (under ~16 MiB) are bound by the latency of each program's chain of steps, not by
bandwidth. Each configuration runs as a chain of calls over rotating weight copies inside one CUDA
graph, launched with programmatic dependent launch and with the fused prologue the model uses
(RMSNorm for norm-fed weights, SwiGLU for ffn_down), so consecutive calls overlap as in the step.
Prints microseconds per call, best first, and each shape's default; the default is also timed
without its prologue (what the fusion costs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "mmq_triton" / "tests"))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from test_decode_bench import _graph_time  # noqa: E402
from test_decode_gemv import make_weight  # noqa: E402

# (type, N, K, role, prologue, candidate configs (BN, BB, warps, MODE, SPLIT))
LEG = [(8, 32, 4, 0, 1), (16, 32, 4, 0, 1), (4, 32, 4, 0, 1), (8, 16, 4, 0, 2), (16, 16, 4, 0, 2),
       (8, 8, 4, 0, 4), (16, 8, 4, 0, 4), (8, 4, 4, 0, 1), (32, 32, 4, 0, 1), (16, 32, 8, 0, 1)]
Q4F = [(8, 8, 4, 0, 4), (16, 8, 4, 0, 4), (8, 4, 4, 0, 8), (16, 4, 4, 0, 4), (8, 16, 4, 0, 2),
       (4, 8, 4, 0, 4), (8, 8, 4, 0, 2), (16, 2, 4, 0, 4)]
Q4I = [(8, 16, 4, 2, 1), (8, 8, 4, 2, 2), (16, 8, 4, 2, 2), (8, 4, 4, 2, 4)]
Q6F = [(8, 2, 4, 0, 8), (8, 4, 4, 0, 4), (16, 2, 4, 0, 8), (8, 1, 2, 0, 16), (4, 4, 4, 0, 4),
       (16, 4, 4, 0, 4)]
SHAPES = {
    "05b": [(QT.Q5_0, 9728, 896, "gate_up", "norm", LEG), (QT.Q5_0, 1152, 896, "qkv", "norm", LEG),
            (QT.Q5_0, 896, 896, "o", "", LEG), (QT.Q5_0, 128, 896, "k", "norm", LEG),
            (QT.Q8_0, 128, 896, "v", "norm", LEG), (QT.Q4_K, 896, 4864, "down", "swiglu", Q4F),
            (QT.Q6_K, 896, 4864, "down", "swiglu", Q6F), (QT.Q8_0, 151936, 896, "output", "norm", LEG[:5])],
    "7b": [(QT.Q4_K, 4608, 3584, "qkv", "norm", Q4F + Q4I), (QT.Q4_K, 3584, 3584, "o", "", Q4F),
           (QT.Q4_K, 512, 3584, "k", "norm", Q4F), (QT.Q6_K, 512, 3584, "v", "norm", Q6F)],
}
ROTATE = 128 << 20


def main() -> None:
    from minfer_mmq_triton import decode

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(SHAPES))
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model, shapes in SHAPES.items():
        if a.only and model != a.only:
            continue
        for qt, n, k, role, pro, cfgs in shapes:
            w0 = make_weight(qt, n, k, gen, device="cuda")
            nbytes = w0.raw.numel()
            copies = max(1, min(16, -(-ROTATE // nbytes)))
            ws = [w0] + [make_weight(qt, n, k, gen, device="cuda") for _ in range(copies - 1)]
            datas = [decode.prepare(w) for w in ws]
            x = torch.randn(1, 2 * k if pro == "swiglu" else k, generator=gen, device="cuda")
            res = torch.randn(1, n, generator=gen, device="cuda")
            kw = {"norm": (torch.rand(k, generator=gen, device="cuda") + 0.5, 1e-6)} if pro == "norm" else \
                {"swiglu": True, "residual": res} if pro == "swiglu" else {"residual": res}
            default = decode.decode_config(qt, n, k, role)
            rows = []
            for cfg, label, args in [(default, "default", kw), (default, "default, no prologue", {})] + \
                    [(c, "", kw) for c in cfgs]:
                xin = x[:, :k] if not args.get("swiglu") else x
                try:
                    fns = [decode.make_gemv(qt, dd, None, n, k, cfg, pdl=True) for dd in datas]
                    t = _graph_time([lambda f=f, xin=xin, args=args: f(xin, **args) for f in fns]
                                    * max(1, 8 // copies))
                except Exception as e:  # a config the compiler rejects: report and go on
                    print(f"  {cfg}: failed {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    continue
                rows.append((t, cfg, label))
            print(f"\n## {model} {qt.name} {n}x{k} ({role}, {pro or 'residual'}, {nbytes / 2**20:.2f} MiB)")
            for t, cfg, label in sorted(rows):
                print(f"  {str(cfg):22s} {t * 1e6:7.2f} us  {nbytes / t / 1e9:6.0f} GB/s  {label}", flush=True)
            del ws, datas
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
