"""Sweep decode GEMV configurations (tile, split, Triton num_stages) at the 7B's shapes (GPU).

    python benchmarks/sweep_gemv.py [--quick]

Each configuration runs over rotating weight copies (more bytes than L2 holds) inside one CUDA
graph; prints microseconds, GB/s and the error against a float64 product, best first per shape.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "mmq_triton" / "tests"))

from gguf import GGMLQuantizationType as QT  # noqa: E402

from test_decode_bench import ROTATE_BYTES, _graph_time  # noqa: E402
from test_decode_gemv import check, make_weight  # noqa: E402

SHAPES = [(QT.Q4_K, 37888, 3584, "gate_up"), (QT.Q4_K, 3584, 18944, "down"), (QT.Q6_K, 3584, 18944, "down"),
          (QT.Q4_K, 4608, 3584, "qkv"), (QT.Q4_K, 3584, 3584, "o"), (QT.Q6_K, 152064, 3584, "output")]


def main() -> None:
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--types", default="Q4_K,Q6_K", help="quant types to sweep (default: both)")
    ap.add_argument("--roles", default="", help="only these roles (comma-separated; default: all)")
    ap.add_argument("--tiles", default="", help='only these int8 tiles, e.g. "8,4,4 16,4,2" (BN,BB,warps)')
    ap.add_argument("--wide", action="store_true", help="also 8-warp and 32-row tiles")
    ap.add_argument("--max-split", type=int, default=0, help="split-K cap (default: decode.INT8_MAX_SPLIT)")
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for qt, n, k, role in [s for s in SHAPES if s[0].name in a.types.split(",")
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
            split = min(a.max_split or decode.INT8_MAX_SPLIT[qt], decode.auto_split(n, nb, bn, bb, nbytes))
            cfgs.append((bn, bb, w, 2, split, 1))
            if role in ("qkv", "o") and w == 4 and qt == QT.Q4_K:
                cfgs.append((bn, bb, w, 0, decode.auto_split(n, nb, bn, bb, nbytes)))
        rows, seen = [], set()
        for cfg in cfgs:
            if cfg in seen:
                continue
            seen.add(cfg)
            try:
                fns = [decode.make_gemv(qt, dd, None, n, k, cfg) for dd in datas]
                err = check(fns[0](x), x, w64, None)
                t = _graph_time([lambda f=f: f(x) for f in fns] * max(1, 8 // copies))
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


if __name__ == "__main__":
    main()
