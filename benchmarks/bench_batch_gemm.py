"""The batched step's GEMMs at the 7B's shapes (one device call): the tensor-core rows GEMMs
(``q4_k.gemm_mma``, ``q6_k.gemm_mma``) against the fused plane GEMM over 16- and 64-row tiles (what
the batched engine runs without them) and, at one row, the single-stream decode GEMV.

    python benchmarks/bench_batch_gemm.py [--rows 1,8,32,128] [--configs T,G,W ...]
        [--fused BM,BN,W,S ...] [--fused-ahead] [--fused-swap [only]] [--ready] [--q6] [--shapes gate_up,down]

``--fused``: the fused plane GEMM at these tiles over all the rows in one call, beside the 64-row
tiles and (above 64 rows) expand + cuBLAS, the prefill route there; ``--fused-ahead``: each with
its q4_K scales loaded a step ahead and not; ``--fused-swap [only]``: each with the weight tile as the
MMA's A operand and the rows as its N, and not (or that alone); ``--ready``: above 64 rows, cuBLAS on a
ready bf16 copy too (``MINFER_MMQ=0``'s route); ``--fused-decode``: each with q4_K decoded in float32 and
in bf16x2; ``--wgmma 1,2,4``: the warpgroup-MMA GEMM (``prefill.gemm_wgmma``) at these splits, with
its largest difference from the fused GEMM's float32 product relative to the largest |value|;
``--ws NA,WG,ST,P,REGS[,SPLIT] ...``: the warp-specialized GEMM (``prefill.gemm_wgmma_ws``) likewise
(split 1 unless given). ``--async NA,WG,ST[,SPLIT] ...``: the asynchronous warpgroup-MMA GEMM
(``prefill.gemm_wgmma_async``) at these tiles (split-K by default from ``tiles.async_split``), with
the same difference; ``--only``: at each row count only the GEMMs asked for, the fused GEMM where the
prefill route takes it and (above 64 rows) expand + cuBLAS; no rows GEMM, no other fused tiles.
``--q6``: the 7B's q6_K weights instead.
``--decode``: q4_K decoded in bf16x2 arithmetic against float32 (``tiles.BF16_DECODE_ROWS``), in the
fused GEMM at each row count's tile and in the plane expansion, with the largest difference between
the two products relative to the largest |value|.

Times are GPU times per call: a CUDA graph of as many calls as there are weight copies (each call
reads the next copy, so that no weight stays in L2), replayed and timed with events (the host's
launch cost, which the batched engine's graphs also avoid, is left out). ``GB/s``: weight bytes
over time.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.linalg import mm_f32
from minfer_mmq_triton import decode, planes, tiles
from minfer_mmq_triton.launch.scratch import jit_matmul
from minfer_mmq_triton.prefill.gemm_planes import dequant_plane, gemm_fused
from minfer_mmq_triton.prefill.gemm_wgmma import gemm_wgmma
from minfer_mmq_triton.prefill.gemm_wgmma_async import gemm_wgmma_async
from minfer_mmq_triton.prefill.gemm_wgmma_ws import gemm_wgmma_ws
from minfer_mmq_triton.q4_k.gemm_mma import gemm_q4p_mma
from minfer_mmq_triton.q6_k.gemm_mma import gemm_q6_mma
from minfer_mmq_triton.q6_k.plane import pack_q6k
from minfer_mmq_triton.synth import random_raw

SHAPES_7B = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
#: the 7B's q6_K weights (``--q6``): half the layers' down, and the output head
SHAPES_7B_Q6 = {"down_q6": (3584, 18944), "output": (152064, 3584)}


def graph_us(calls) -> float:
    """Microseconds per call of ``calls`` (closures), captured in one CUDA graph and replayed."""
    for c in calls:  # compile and allocate outside the capture
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,32,128")
    ap.add_argument("--configs", nargs="*", default=None, help="T,G,W of the rows GEMM (default: tiles.ROWS_TILE)")
    ap.add_argument("--ahead", default=None, help="blocks of L2 prefetch ahead in the rows GEMM, e.g. 0,2,4 "
                    "(default: the kernel's own choice)")
    ap.add_argument("--fused", nargs="*", default=[], help="BM,BN,W,S tiles of the fused GEMM over all rows")
    ap.add_argument("--q6", action="store_true", help="the q6_K weights (down of half the layers, output head)")
    ap.add_argument("--fused-ahead", action="store_true",
                    help="--fused: each tile with its q4_K scales loaded in their step and a step ahead")
    ap.add_argument("--fused-swap", nargs="?", const="both", choices=("both", "only"),
                    help="--fused: each tile with the weight tile as the MMA's A operand (gemm_fused swap) and "
                         "not; 'only': swapped alone")
    ap.add_argument("--ready", action="store_true",
                    help="above 64 rows: cuBLAS on a ready bf16 copy of the weight too (MINFER_MMQ=0's route)")
    ap.add_argument("--fused-decode", action="store_true",
                    help="--fused: each tile with q4_K decoded in float32 and in bf16x2 (gemm_fused packed)")
    ap.add_argument("--wgmma", default="", help="splits of the warpgroup-MMA GEMM (prefill.gemm_wgmma), e.g. 1,2,4")
    ap.add_argument("--async", dest="tiles", nargs="*", default=[],
                    help="NA,WG,STAGES[,SPLIT] tiles of the asynchronous warpgroup-MMA GEMM (prefill.gemm_wgmma_async)")
    ap.add_argument("--ws", dest="ws_tiles", nargs="*", default=[],
                    help="NA,WG,STAGES,P,REGS[,SPLIT] tiles of the warp-specialized GEMM (prefill.gemm_wgmma_ws)")
    ap.add_argument("--shapes", default=None, help="only these weights, e.g. gate_up,down")
    ap.add_argument("--only", action="store_true", help="no rows GEMM, no fused tiles: only the GEMMs asked for")
    ap.add_argument("--decode", action="store_true", help="q4_K decoded in bf16x2 vs float32 (fused GEMM, expansion)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.decode:
        return decode_ab(rows)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs else [tiles.ROWS_TILE]
    configs = [] if args.only else configs
    async_tiles = [tuple(int(v) for v in c.split(",")) for c in args.tiles]
    ws_tiles = [tuple(int(v) for v in c.split(",")) for c in args.ws_tiles]
    fused = [tuple(int(v) for v in c.split(",")) for c in args.fused]
    aheads = [int(v) for v in args.ahead.split(",")] if args.ahead else [None]
    print("| weight | rows | kernel | us | GB/s |\n|---|---|---|---|---|")
    qt, build = (QT.Q6_K, planes.build_q6k) if args.q6 else (QT.Q4_K, planes.build_q4k)
    for name, (n, k) in (SHAPES_7B_Q6 if args.q6 else SHAPES_7B).items():
        if args.shapes and name not in args.shapes.split(","):
            continue
        copies = max(2, int(200e6 // (n * k * 0.5625)) + 1)
        raws = [random_raw(qt, n, k, "cuda", seed=i) for i in range(copies)]
        ps = [build(r, k) for r in raws]
        dps = {id(p): pack_q6k(r, k) if args.q6 else p for p, r in zip(ps, raws)}  # the decode (and rows) plane
        del raws
        nbytes = ps[0].nbytes()
        gemm_rows = gemm_q6_mma if args.q6 else gemm_q4p_mma

        def row(m, label, fn):
            us = graph_us([lambda p=p: fn(p) for p in ps])
            print(f"| {name} {n}x{k} | {m} | {label} | {us:.1f} | {nbytes / us / 1e3:.0f} |", flush=True)

        for m in rows:
            x = torch.randn(m, k, device="cuda")
            for (t, g, w), ah in itertools.product(configs, aheads):
                row(m, f"rows T{t} G{g} W{w}" + ("" if ah is None else f" ahead {ah}"),
                    lambda p: gemm_rows(x, dps[id(p)], None, t, g, w, tiles.fused_split(n, k // 128, 16 * t * w),
                                        ahead=ah))
            am = torch.randn(m, k, device="cuda").bfloat16()
            na = tiles.wgmma_rows(m)
            want = gemm_fused(am, ps[0], None, packed=False) if args.wgmma or async_tiles or ws_tiles else None
            for split in [int(v) for v in args.wgmma.split(",") if v]:
                err = ((gemm_wgmma(am, ps[0], None, na, split) - want).abs().max() / want.abs().max()).item()
                row(m, f"wgmma split {split} (max diff / max {err:.1e})",
                    lambda p: gemm_wgmma(am, p, None, na, split))
            for na, wg, st, *more in async_tiles:
                split = more[0] if more else tiles.async_split(m, n, k, (na, wg, st))
                err = ((gemm_wgmma_async(am, ps[0], None, split, tile=(na, wg, st)) - want).abs().max()
                       / want.abs().max()).item()
                row(m, f"async NA {na} WG {wg} ST {st} split {split} (max diff / max {err:.1e})",
                    lambda p: gemm_wgmma_async(am, p, None, split, tile=(na, wg, st)))
            for na, wg, st, p, regs, *more in ws_tiles:
                split = more[0] if more else 1
                err = ((gemm_wgmma_ws(am, ps[0], None, split, tile=(na, wg, st, p, regs)) - want).abs().max()
                       / want.abs().max()).item()
                row(m, f"warp-specialized NA {na} WG {wg} ST {st} P {p} REGS {regs} split {split} "
                       f"(max diff / max {err:.1e})",
                    lambda p_: gemm_wgmma_ws(am, p_, None, split, tile=(na, wg, st, p, regs)))
            for tile in () if args.only else (16, 64) if m <= 16 else (64,):
                a = torch.randn(tile, k, device="cuda").bfloat16()
                count = -(-m // tile)
                row(m, f"fused x{count} ({tile}-row tiles)", lambda p: [gemm_fused(a, p, None) for _ in range(count)])
            both = (False, True)
            swaps = {None: (False,), "both": both, "only": (True,)}[args.fused_swap]
            for cfg, early, swap, packed in itertools.product(
                    fused, both if args.fused_ahead else (None,), swaps, both if args.fused_decode else (None,)):
                label = (f"fused {cfg} (all rows)" + ("" if early is None else f" ahead {int(early)}")
                         + (" swapped" if swap else "")
                         + ("" if packed is None else " bf16x2" if packed else " float32"))
                row(m, label, lambda p: gemm_fused(am, p, None, cfg, ahead=early, swap=swap, packed=packed))
            if args.only and tiles.use_fused(m, n, k):
                row(m, "fused (the route's tile)", lambda p: gemm_fused(am, p, None))
            if (fused or args.only) and m > 64:
                row(m, "expand + cuBLAS",
                    lambda p: jit_matmul(am, n, k, None, lambda o, r0, r1: dequant_plane(p, k, o, r0, r1)))
            if args.ready and m > 64:
                ready = {id(p): dequant_plane(p, k, torch.empty(n, k, dtype=torch.bfloat16, device="cuda"))
                         for p in ps}
                row(m, "cuBLAS on a ready bf16 weight", lambda p: mm_f32(am, ready[id(p)]))
                del ready
            if m == 1:
                gemvs = {id(p): decode.make_gemv(qt, dps[id(p)], None, n, k, config=tiles.mma_config(qt, n))
                         for p in ps}
                row(m, "decode GEMV (mma)", lambda p: gemvs[id(p)](x))
        del ps, dps
        torch.cuda.empty_cache()


def decode_ab(rows: list[int]) -> None:
    """``--decode``: the fused GEMM (each row count's default tile) and the expansion, q4_K decoded
    in bf16x2 against float32, us a call."""
    print("| weight | rows | kernel | float32 decode us | bf16x2 decode us | ratio | max diff / max |\n"
          "|---|---:|---|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES_7B.items():
        copies = max(2, int(200e6 // (n * k * 0.5625)) + 1)
        ps = [planes.build_q4k(random_raw(QT.Q4_K, n, k, "cuda", seed=i), k) for i in range(copies)]

        def line(m, label, fn):
            us = [graph_us([lambda p=p, f=f: fn(p, f) for p in ps]) for f in (False, True)]
            a, b = fn(ps[0], False).float(), fn(ps[0], True).float()
            diff = ((a - b).abs().max() / a.abs().max()).item()
            print(f"| {name} {n}x{k} | {m} | {label} | {us[0]:.1f} | {us[1]:.1f} | {us[1] / us[0]:.2f} | {diff:.1e} |",
                  flush=True)

        for m in rows:
            am = torch.randn(m, k, device="cuda").bfloat16()
            line(m, f"fused {tiles.fused_gemm_tile(m, QT.Q4_K)}", lambda p, f: gemm_fused(am, p, None, packed=f))
        out = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
        line(n, "expansion", lambda p, f: dequant_plane(p, k, out, packed=f))
        del ps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
