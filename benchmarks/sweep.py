"""Sweep decode GEMV launch configurations on the GPU; the winners go into ``minfer_mmq_triton/tiles.py``.

    python benchmarks/sweep.py gemv [--quick] [--types Q4_K,Q6_K] [--roles ..] [--tiles "8,4,4 .."] [--wide]
    python benchmarks/sweep.py small [--only 05b|7b]
    python benchmarks/sweep.py mma [--q6]

``gemv``: tile, split and Triton num_stages of the 7B's large GEMVs (float and dp4a int8), error
against a float64 product. ``small``: tiles and splits of the short GEMVs (under ~16 MiB, latency
bound) with PDL and the fused prologue the model uses (RMSNorm for norm-fed weights, SwiGLU for
ffn_down); the default is also timed without its prologue. ``mma``: the dp4a int8 GEMVs against the
tensor-core ones (``q4_k.gemv_mma``, ``--q6``: ``q6_k.gemv_mma``) over their configs.

Every configuration runs as a chain of calls over rotating weight copies (more bytes than L2 holds)
inside one CUDA graph; prints microseconds per call and GB/s of weight bytes, best first per shape.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "plugins" / "mmq_triton" / "tests")]

from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench_decode import ROTATE_BYTES, graph_time  # noqa: E402
from test_decode_gemv import check, make_weight  # noqa: E402

# -- gemv: the 7B's large GEMVs -----------------------------------------------------------------

GEMV_SHAPES = [(QT.Q4_K, 37888, 3584, "gate_up"), (QT.Q4_K, 3584, 18944, "down"), (QT.Q6_K, 3584, 18944, "down"),
               (QT.Q4_K, 4608, 3584, "qkv"), (QT.Q4_K, 3584, 3584, "o"), (QT.Q6_K, 152064, 3584, "output")]


def sweep_gemv(a) -> None:
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode, tiles

    gen = torch.Generator(device="cuda").manual_seed(0)
    for qt, n, k, role in [s for s in GEMV_SHAPES if s[0].name in a.types.split(",")
                           and (not a.roles or s[3] in a.roles.split(","))]:
        ws = [make_weight(qt, n, k, gen, device="cuda")]
        nbytes = ws[0].raw.numel()
        copies = max(1, min(16, -(-ROTATE_BYTES // nbytes)))
        ws += [make_weight(qt, n, k, gen, device="cuda") for _ in range(copies - 1)]
        datas = [decode.prepare(w) for w in ws]
        x = torch.randn(1, k, generator=gen, device="cuda")
        w64 = dequantize(ws[0].raw, qt, k).double()
        nb = k // (128 if qt == QT.Q4_K else 256)  # steps count 128-value spans for the q4_K plane
        default = decode.decode_config(qt, n, k, role)
        cfgs = [default + (3,)]
        if role in ("qkv", "o", "gate_up"):
            cfgs.append(decode.decode_config(qt, n, k, "") + (3,))
        # BB is taken as given (a step may run past the row: masked), so one step can cover a whole row
        grid = itertools.product((4, 8, 16), (2, 4, 8, 16), (2, 4)) if not a.quick else [(8, 2, 2), (8, 16, 4)]
        if a.tiles:
            grid = [tuple(int(v) for v in c.split(",")) for c in a.tiles.split()]
        if a.wide:
            grid = list(grid) + [(16, 4, 8), (32, 4, 8), (32, 2, 4), (16, 8, 8), (32, 4, 4)]
        for bn, bb, w in grid:
            if bn * bb * 64 * 4 > 64 * 1024 or bb > nb:  # over 64 KiB of quant words per step, or empty steps
                continue
            split = min(a.max_split or tiles.INT8_MAX_SPLIT[qt], tiles.auto_split(n, nb, bn, bb, nbytes))
            cfgs.append((bn, bb, w, 2, split, 1))
            if role in ("qkv", "o") and w == 4 and qt == QT.Q4_K:
                cfgs.append((bn, bb, w, 0, tiles.auto_split(n, nb, bn, bb, nbytes)))
        rows, seen = [], set()
        for cfg in cfgs:
            if cfg in seen:
                continue
            seen.add(cfg)
            try:
                fns = [decode.make_gemv(qt, dd, None, n, k, cfg) for dd in datas]
                err = check(fns[0](x), x, w64, None)
                t = graph_time([lambda f=f: f(x) for f in fns] * max(1, 8 // copies))
            except Exception as e:  # a config the compiler rejects (resources): report and go on
                print(f"  {cfg}: failed {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                continue
            rows.append((t, cfg, err))
        rows.sort()
        print(f"\n## {qt.name} {n}x{k} ({role}, {nbytes / 2**20:.1f} MiB); default {default}: "
              f"{next(r[0] for r in rows if r[1] == default + (3,)) * 1e6:.1f} us")
        for t, cfg, err in rows[:10]:
            print(f"  {cfg}: {t * 1e6:7.1f} us  {nbytes / t / 1e9:6.0f} GB/s  err {err:.1e}", flush=True)
        del ws, datas, w64
        torch.cuda.empty_cache()


# -- small: the short GEMVs as the decode step runs them -------------------------------------------

# (type, N, K, role, prologue, candidate configs (BN, BB, warps, MODE, SPLIT))
LEG = [(8, 32, 4, 0, 1), (16, 32, 4, 0, 1), (4, 32, 4, 0, 1), (8, 16, 4, 0, 2), (16, 16, 4, 0, 2),
       (8, 8, 4, 0, 4), (16, 8, 4, 0, 4), (8, 4, 4, 0, 1), (32, 32, 4, 0, 1), (16, 32, 8, 0, 1)]
Q4F = [(8, 8, 4, 0, 4), (16, 8, 4, 0, 4), (8, 4, 4, 0, 8), (16, 4, 4, 0, 4), (8, 16, 4, 0, 2),
       (4, 8, 4, 0, 4), (8, 8, 4, 0, 2), (16, 2, 4, 0, 4)]
Q4I = [(8, 16, 4, 2, 1), (8, 8, 4, 2, 2), (16, 8, 4, 2, 2), (8, 4, 4, 2, 4)]
Q6F = [(8, 2, 4, 0, 8), (8, 4, 4, 0, 4), (16, 2, 4, 0, 8), (8, 1, 2, 0, 16), (4, 4, 4, 0, 4),
       (16, 4, 4, 0, 4)]
SMALL_SHAPES = {
    "05b": [(QT.Q5_0, 9728, 896, "gate_up", "norm", LEG), (QT.Q5_0, 1152, 896, "qkv", "norm", LEG),
            (QT.Q5_0, 896, 896, "o", "", LEG), (QT.Q5_0, 128, 896, "k", "norm", LEG),
            (QT.Q8_0, 128, 896, "v", "norm", LEG), (QT.Q4_K, 896, 4864, "down", "swiglu", Q4F),
            (QT.Q6_K, 896, 4864, "down", "swiglu", Q6F), (QT.Q8_0, 151936, 896, "output", "norm", LEG[:5])],
    "7b": [(QT.Q4_K, 4608, 3584, "qkv", "norm", Q4F + Q4I), (QT.Q4_K, 3584, 3584, "o", "", Q4F),
           (QT.Q4_K, 512, 3584, "k", "norm", Q4F), (QT.Q6_K, 512, 3584, "v", "norm", Q6F)],
}
SMALL_ROTATE = 128 << 20


def sweep_small(a) -> None:
    from minfer_mmq_triton import decode

    gen = torch.Generator(device="cuda").manual_seed(0)
    for model, shapes in SMALL_SHAPES.items():
        if a.only and model != a.only:
            continue
        for qt, n, k, role, pro, cfgs in shapes:
            w0 = make_weight(qt, n, k, gen, device="cuda")
            nbytes = w0.raw.numel()
            copies = max(1, min(16, -(-SMALL_ROTATE // nbytes)))
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
                    t = graph_time([lambda f=f, xin=xin, args=args: f(xin, **args) for f in fns]
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


# -- mma: dp4a against tensor cores -------------------------------------------------------------

MMA_SHAPES = [(37888, 3584, "gate_up", "norm"), (3584, 18944, "down", "swiglu"), (4608, 3584, "qkv", "norm")]
#: q4_K: (tiles, spans, warps, lookahead)
MMA = [(1, 2, 4, 0), (1, 2, 4, 1), (1, 4, 4, 0), (1, 4, 4, 1), (2, 2, 4, 1), (1, 2, 2, 1), (1, 2, 8, 1)]
#: q6_K: (N, K, role, prologue), configs (tiles, blocks a step, warps)
Q6_SHAPES = [(3584, 18944, "down", "swiglu"), (152064, 3584, "output", "norm")]
Q6_MMA = [(1, 1, 4), (2, 1, 4), (1, 2, 4), (1, 1, 2), (1, 1, 8), (2, 2, 4), (1, 4, 4)]


def _sweep_mma(qt, shapes, configs, splits_for, seed: int) -> None:
    """Time the dp4a default and every MMA config ``(tiles, step, warps[, lookahead])`` at each shape."""
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.launch.mma import mma_rows
    from minfer_mmq_triton.launch.split import SplitScratch
    from minfer_mmq_triton.q4_k.gemv_mma import gemv_q4p_mma
    from minfer_mmq_triton.q6_k.gemv_mma import gemv_q6k_mma

    mma_fn = gemv_q4p_mma if qt == QT.Q4_K else gemv_q6k_mma
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for n, k, role, pro in shapes:
        w0 = make_weight(qt, n, k, gen, device="cuda")
        nbytes = w0.raw.numel()
        copies = max(2, min(16, -(-ROTATE_BYTES // nbytes)))
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
        rows = [(graph_time([lambda f=f: f(x, **kw) for f in fns] * reps), f"triton {default}")]
        for cfg in configs:
            tiles, step, warps = cfg[:3]
            extra = {"lookahead": bool(cfg[3])} if len(cfg) > 3 else {}
            for split in splits_for(n):
                bn = mma_rows(tiles, warps)
                try:
                    scr = [SplitScratch(n, bn, split) for _ in datas]
                    fns = [lambda d=d, sc=sc: mma_fn(x, d, None, tiles, step, warps, split, sc, pdl=True, **extra,
                                                     **kw) for d, sc in zip(datas, scr)]
                    t = graph_time(fns * reps)
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


def sweep_mma(a) -> None:
    if a.q6:
        _sweep_mma(QT.Q6_K, Q6_SHAPES, Q6_MMA, lambda n: [1] if n > 16384 else [2, 4, 8], seed=1)
    else:
        _sweep_mma(QT.Q4_K, MMA_SHAPES, MMA, lambda n: [1] if n > 8192 else [4, 8], seed=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemv", help="the 7B's large GEMVs: tiles, splits, num_stages")
    g.add_argument("--quick", action="store_true")
    g.add_argument("--types", default="Q4_K,Q6_K", help="quant types to sweep (default: both)")
    g.add_argument("--roles", default="", help="only these roles (comma-separated; default: all)")
    g.add_argument("--tiles", default="", help='only these int8 tiles, e.g. "8,4,4 16,4,2" (BN,BB,warps)')
    g.add_argument("--wide", action="store_true", help="also 8-warp and 32-row tiles")
    g.add_argument("--max-split", type=int, default=0, help="split-K cap (default: tiles.INT8_MAX_SPLIT)")
    s = sub.add_parser("small", help="the short GEMVs under PDL with their fused prologue")
    s.add_argument("--only", choices=sorted(SMALL_SHAPES))
    m = sub.add_parser("mma", help="dp4a against tensor-core int8 GEMVs")
    m.add_argument("--q6", action="store_true", help="q6_K (default: q4_K)")
    a = ap.parse_args()
    {"gemv": sweep_gemv, "small": sweep_small, "mma": sweep_mma}[a.what](a)


if __name__ == "__main__":
    main()
