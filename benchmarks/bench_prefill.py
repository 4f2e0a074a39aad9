"""Prefill matmul benchmark + GPU correctness sweep for the mmq_triton kernels (one device call).

Usage (GPU machine, repo root on PYTHONPATH with plugins/mmq_triton):
    python benchmarks/bench_prefill.py [--final | --small] [--skip-check] [--out DIR]

1. correctness: every served type x real (N, K) layouts x M in {16, 17, 100, 3314}, both designs,
   against minfer_core.dequant (checked bit-exact against gguf.quants on a slice) + float64 GEMM;
2. timings (median, do_bench) at the 7B shapes for M in {16, 64, 128, 256, 512, 3314}:
   cuBLAS bf16 on a ready bf16 weight (the ceiling), just-in-time dequant + cuBLAS, the fused
   Triton GEMM (a few tile configs), the dequant kernels alone, the producers;
3. a per-layer projection of 7B prefill tok/s from the best path per M.
``--final``: only the routed path against cuBLAS; ``--small``: only 16 and 64 rows, the fused GEMM's
tiles and split-K choices against the just-in-time path.
Weights rotate among copies so that no timing runs out of L2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
from gguf import GGMLQuantizationType as QT

from minfer_core import linalg
from minfer_core.dequant import dequantize
from minfer_mmq_triton import planes, tiles
from minfer_mmq_triton.families import SERVED
from minfer_mmq_triton.launch import scratch
from minfer_mmq_triton.ops import producers
from minfer_mmq_triton.prefill import dequant_raw as gemm_generic, gemm_planes
from minfer_mmq_triton.synth import random_raw

DEQUANT_CFGS = [(32, 2, 4), (64, 2, 8), (16, 4, 4), (32, 4, 8), (64, 1, 4)]
SHAPES_7B = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584), "down": (3584, 18944)}
LOG: list[dict] = []


def bf16_copies(n: int, k: int) -> int:
    """Copies of an (n, k) weight to rotate through: ~2 GB of bf16 in all (2 to 6), so no timing
    reads it from L2."""
    return min(6, max(2, int(4 * 2**28 // (n * k)) + 1))


class Rotation:
    """``nxt()``: the indices 0 .. n-1 in turn (``nxt.i`` the current one), so that each timed call
    reads the next copy of a weight."""

    def __init__(self, n: int):
        self.n, self.i = n, 0

    def __call__(self) -> int:
        self.i = (self.i + 1) % self.n
        return self.i


def log(**kw):
    LOG.append(kw)
    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()), flush=True)


def bench(fn, reps=60) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median")


def _cpu_time(fn, reps=0) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def errs(y, ref):
    d = (y.double() - ref)
    return float(d.norm() / ref.norm()), float(d.abs().max() / ref.abs().max())


# -- 1. correctness ------------------------------------------------------------------------------

DEV = "cuda"


def check_oracle():
    """minfer_core.dequant equals gguf.quants on a slice of every type (so it may be the oracle)."""
    from gguf.quants import dequantize as gq
    for qt in SERVED:
        raw = random_raw(qt, 8, 512, DEV, 7)
        a = dequantize(raw, qt, 512).cpu()
        b = torch.from_numpy(gq(raw.cpu().numpy(), qt).reshape(8, 512))
        assert torch.equal(a, b), qt


def correctness(tiny: bool):
    dev = DEV
    layouts = [(1152, 896), (896, 4864), (4608, 3584), (3584, 18944)]
    ms = [16, 17, 100, 3314]
    if tiny:
        layouts, ms = [(40, 288), (24, 512)], [16, 17]
    worst = 0.0
    for qt in SERVED:
        for n, k in layouts:
            if k % 256 and qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
                continue
            if k == 18944 and qt not in planes.BUILDERS:
                continue
            raw = random_raw(qt, n, k, dev, n + k)
            w = dequantize(raw, qt, k).double()
            bias = torch.randn(n, device=dev)
            big = n * k > 20e6
            paths = {"raw": lambda a, b: scratch.jit_matmul(a, n, k, b, lambda o, r0, r1: gemm_generic.dequant_raw(raw, qt, k, o, r0, r1))}
            if qt in planes.BUILDERS:
                p = planes.BUILDERS[qt][1](raw, k)
                paths["plane_jit"] = lambda a, b, p=p: scratch.jit_matmul(a, n, k, b, lambda o, r0, r1: gemm_planes.dequant_plane(p, k, o, r0, r1))
                paths["plane_fused"] = lambda a, b, p=p: gemm_planes.gemm_fused(a, p, b)
                wp = torch.full((n, k), float("nan"), dtype=torch.bfloat16, device=dev)
                gemm_planes.dequant_plane(p, k, wp)
                fro, mx = errs(wp, w)
                log(check="dequant_plane", type=qt.name, n=n, k=k, fro=fro, max=mx)
                assert fro < 4e-3 and mx < 1e-2, (qt, n, k)
            wr = torch.full((n, k), float("nan"), dtype=torch.bfloat16, device=dev)
            gemm_generic.dequant_raw(raw, qt, k, wr)
            fro, mx = errs(wr, w)
            log(check="dequant_raw", type=qt.name, n=n, k=k, fro=fro, max=mx)
            assert fro < 4e-3 and mx < 1e-2, (qt, n, k)
            for m in ms:
                x = torch.randn(m, k, device=dev)
                ref = x.double() @ w.T + bias.double()
                for name, fn in paths.items():
                    y = fn(x.to(torch.bfloat16), bias)
                    fro, mx = errs(y, ref)
                    worst = max(worst, fro)
                    ok = fro < 1e-2 and mx < 2e-2 and bool(torch.isfinite(y).all())
                    if not ok or m in (17, 3314) and not big:
                        log(check="gemm", type=qt.name, path=name, m=m, n=n, k=k, fro=fro, max=mx, ok=ok)
                    assert ok, (qt, name, m, n, k, fro, mx)
    log(check="all", worst_fro=worst)


def producers_check(tiny: bool):
    for m, k in [(17, 96)] if tiny else [(17, 896), (3314, 3584)]:
        x = torch.randn(m, k, device=DEV) * 3
        w = torch.randn(k, device=DEV)
        ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        for wf in (True, False):
            act = producers.rmsnorm(x, w, 1e-6, wf)
            assert (act.f32 is not None) == wf
            if wf:
                assert torch.allclose(act.f32, ref, rtol=1e-5, atol=1e-5)
            assert torch.allclose(act.plane.float(), ref, rtol=1e-2, atol=1e-2)
        gu = torch.randn(m, 2 * k, device=DEV) * 3
        ref = torch.nn.functional.silu(gu[:, :k]) * gu[:, k:]
        act = producers.swiglu(gu, True)
        assert torch.allclose(act.f32, ref, rtol=1e-5, atol=1e-5)
        assert torch.allclose(act.plane.float(), ref, rtol=1e-2, atol=1e-2)
    log(check="producers", ok=True)


# -- 2. timings ------------------------------------------------------------------------------------

def timings(ms, fused_cfgs, shapes):
    dev = DEV
    res = {}
    for name, (n, k) in shapes.items():
        types = [QT.Q4_K] + ([QT.Q6_K] if name == "down" else [])
        copies = bf16_copies(n, k)
        w16 = [torch.randn(n, k, device=dev).to(torch.bfloat16) for _ in range(copies)]
        for qt in types:
            raws = [random_raw(qt, n, k, dev, i) for i in range(copies)]
            pls = [planes.BUILDERS[qt][1](r, k) for r in raws]
            raw_mb = raws[0].numel() / 2**20
            log(mem=name, type=qt.name, raw_MiB=raw_mb, plane_MiB=pls[0].nbytes() / 2**20)
            nxt = Rotation(copies)
            scratch_w = torch.empty(n, k, dtype=torch.bfloat16, device=dev)
            t_dq = bench(lambda: gemm_planes.dequant_plane(pls[nxt()], k, scratch_w))
            if name in ("gate_up", "down"):
                for dcfg in DEQUANT_CFGS:
                    if qt == QT.Q6_K and dcfg[1] != 1:
                        continue
                    t = bench(lambda: gemm_planes.dequant_plane(pls[nxt()], k, scratch_w, config=dcfg))
                    log(op="dequant_cfg", shape=name, type=qt.name, cfg=dcfg, ms=t,
                        TBps=(pls[0].nbytes() + n * k * 2) / t / 1e9)
            t_dr = bench(lambda: gemm_generic.dequant_raw(raws[nxt()], qt, k, scratch_w))
            byt = pls[0].nbytes() + n * k * 2
            log(op="dequant_plane", shape=name, type=qt.name, ms=t_dq, TBps=byt / t_dq / 1e9)
            log(op="dequant_raw", shape=name, type=qt.name, ms=t_dr, TBps=(raws[0].numel() + n * k * 2) / t_dr / 1e9)
            for m in ms:
                a = torch.randn(m, k, device=dev).to(torch.bfloat16)
                flop = 2 * m * n * k
                row = {}
                if qt == QT.Q4_K:
                    row["cublas"] = bench(lambda: linalg.mm_f32(a, w16[nxt()]))
                    row["cublas_bf16out"] = bench(lambda: torch.mm(a, w16[nxt()].t()))
                row["jit"] = bench(lambda: scratch.jit_matmul(
                    a, n, k, None, lambda o, r0, r1: gemm_planes.dequant_plane(pls[nxt()], k, o, r0, r1)))
                if m <= 512 or qt == QT.Q4_K:
                    row["fused"] = bench(lambda: gemm_planes.gemm_fused(a, pls[nxt()], None))
                if m in (16, 64):
                    bm = 16 if m == 16 else 64
                    for bn in (16, 32, 64, 128):
                        cfg = (bm, bn, 4, 3)
                        row[f"fused{cfg}"] = bench(lambda: gemm_planes.gemm_fused(a, pls[nxt()], None, cfg))
                if m >= 256 and qt == QT.Q4_K:
                    for cfg in fused_cfgs:
                        row[f"fused{cfg}"] = bench(lambda: gemm_planes.gemm_fused(a, pls[nxt()], None, cfg))
                for kname, t in row.items():
                    log(op="gemm", shape=name, type=qt.name, m=m, path=kname, ms=t, TFLOPs=flop / t / 1e9)
                res[(name, qt.name, m)] = row
    return res


SHAPES_05B = {"qkv": (1152, 896, QT.Q5_0), "o": (896, 896, QT.Q5_0), "gate_up": (9728, 896, QT.Q5_0),
              "down": (896, 4864, QT.Q4_K), "down6": (896, 4864, QT.Q6_K)}


def routed(a, w, n, k, p, qt):
    """What the plugin's prefill callable does (routes._plane_fn / _raw_fn), for timing."""
    if p is not None and tiles.use_fused(a.shape[0], n, k):
        return gemm_planes.gemm_fused(a, p, None)
    if p is not None:
        return scratch.jit_matmul(a, n, k, None, lambda o, r0, r1: gemm_planes.dequant_plane(p, k, o, r0, r1))
    return scratch.jit_matmul(a, n, k, None, lambda o, r0, r1: gemm_generic.dequant_raw(w, qt, k, o, r0, r1))


def jit_l2(a, n, k, p, rows):
    """Experiment: expand ``rows``-row chunks into one reused (L2-resident) scratch, cuBLAS each
    chunk into its column slice of the output. Measured 2-5x slower than one scratch (H200,
    2026-11-30): kept only to record that result."""
    y = torch.empty(a.shape[0], n, dtype=torch.float32, device=a.device)
    w = torch.empty(rows, k, dtype=torch.bfloat16, device=a.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        wc = w[:r1 - r0]
        gemm_planes.dequant_plane(p, k, wc, r0, r1)
        torch.mm(a, wc.t(), out_dtype=torch.float32, out=y[:, r0:r1])
    return y


def final_timings(ms, tiny=False):
    """The routed path (the plugin's choice) vs cuBLAS on a ready bf16 weight, 7B and 0.5B."""
    res = {}
    s7 = {"qkv": (48, 256), "o": (32, 256), "gate_up": (64, 256), "down": (32, 512)} if tiny else SHAPES_7B
    s05 = {k: (v[0] // 32, v[1] // 28 * 2 if v[1] == 896 else 512, v[2]) for k, v in SHAPES_05B.items()} if tiny else SHAPES_05B
    l2k = 256 if tiny else 3584
    for model, shapes in (("7b", {k: v + (QT.Q4_K,) for k, v in s7.items()}), ("0.5b", s05)):
        if model == "7b":
            shapes["down6"] = s7["down"] + (QT.Q6_K,)
        for name, (n, k, qt) in shapes.items():
            copies = bf16_copies(n, k)
            raws = [random_raw(qt, n, k, DEV, i) for i in range(copies)]
            pls = [planes.BUILDERS[qt][1](r, k) if qt in planes.BUILDERS else None for r in raws]
            w16 = torch.randn(n, k, device=DEV).to(torch.bfloat16)
            nxt = Rotation(copies)
            for m in (ms if model == "7b" else ms[-2:]):
                a = torch.randn(m, k, device=DEV).to(torch.bfloat16)
                flop = 2 * m * n * k
                row = {"cublas": bench(lambda: linalg.mm_f32(a, w16)),
                       "route": bench(lambda: routed(a, raws[nxt.i], n, k, pls[nxt()], qt))}
                if model == "7b" and k == l2k and m >= 512 and qt == QT.Q4_K:
                    for rows in (1536, 3072):
                        try:
                            y = jit_l2(a, n, k, pls[0], rows)
                            ref = routed(a, raws[0], n, k, pls[0], qt)
                            log(check="jit_l2", shape=name, m=m, rows=rows, fro=errs(y, ref.double())[0])
                            row[f"jit_l2_{rows}"] = bench(lambda: jit_l2(a, n, k, pls[nxt()], rows))
                        except Exception as e:  # experiment only
                            log(check="jit_l2", error=repr(e)[:200])
                for kname, t in row.items():
                    log(final=model, shape=name, type=qt.name, m=m, path=kname, ms=t, TFLOPs=flop / t / 1e9)
                res[(model, name, m)] = row["route"]
    for m in ms:
        lay = [res[("7b", s, m)] for s in ("qkv", "o", "gate_up")]
        per = sum(lay) + 0.5 * (res[("7b", "down", m)] + res[("7b", "down6", m)])
        attn = 0.164 * (m / 3314) ** 2
        log(projection_final="7b", m=m, linear_ms=28 * per, attn_ms=28 * attn, tok_s=m / (28 * (per + attn)) * 1e3)
    for m in ms[-2:]:
        per = sum(res[("0.5b", s, m)] for s in ("qkv", "o", "gate_up")) + 0.5 * (res[("0.5b", "down", m)] + res[("0.5b", "down6", m)])
        attn = 0.041 * (m / 3314) ** 2
        log(projection_final="0.5b", m=m, linear_ms=24 * per, attn_ms=24 * attn, tok_s=m / (24 * (per + attn)) * 1e3)


SHAPES_SMALL_M = {"qkv": (4608, 3584, QT.Q4_K), "o": (3584, 3584, QT.Q4_K), "gate_up": (37888, 3584, QT.Q4_K),
                  "down": (3584, 18944, QT.Q4_K), "down6": (3584, 18944, QT.Q6_K), "head6": (152064, 3584, QT.Q6_K)}


def small_m(ms, tiny=False):
    """Few rows (the batched engine's steps, short prompts) at the 7B shapes: the fused GEMM under
    a few tiles and split-K choices, beside the just-in-time path;
    the weight's bytes over the time give its streaming rate."""
    shapes = {k: (v[0] // 64, 512, v[2]) for k, v in SHAPES_SMALL_M.items()} if tiny else SHAPES_SMALL_M
    for name, (n, k, qt) in shapes.items():
        copies = min(6, max(2, int(2**30 // (n * k // 2)) + 1))
        pls = [planes.BUILDERS[qt][1](random_raw(qt, n, k, DEV, i), k) for i in range(copies)]
        nxt = Rotation(copies)
        span = 128 if qt == QT.Q4_K else 256
        for m in ms:
            x = torch.randn(m, k, device=DEV)
            a = x.to(torch.bfloat16)
            row = {"jit": bench(lambda: scratch.jit_matmul(
                a, n, k, None, lambda o, r0, r1: gemm_planes.dequant_plane(pls[nxt()], k, o, r0, r1)))}
            row["fused"] = bench(lambda: gemm_planes.gemm_fused(a, pls[nxt()], None))
            bm = tiles.fused_gemm_tile(m, qt)[0]
            for bn, warps in ((32, 4), (64, 4), (128, 8)):
                auto = tiles.fused_split(n, k // span, bn)
                for split in sorted({max(1, auto // 2), auto, min(tiles.FUSED_MAX_SPLIT, auto * 2)}):
                    cfg = (bm, bn, warps, 3, split)
                    row[f"fused{cfg}" + ("*" if split == auto else "")] = bench(
                        lambda: gemm_planes.gemm_fused(a, pls[nxt()], None, cfg))
            nbytes = pls[0].nbytes()
            for p, t in row.items():
                log(small=name, type=qt.name, m=m, path=p, ms=t, TBps=nbytes / t / 1e9)
            best = min((t, p) for p, t in row.items() if p.startswith("fused("))
            log(small_best=name, m=m, jit=row["jit"], fused=row["fused"], best=best[0], cfg=best[1])


def producer_timings(tiny: bool):
    e, f = (64, 128) if tiny else (3584, 18944)
    for m in (512, 3314):
        x = torch.randn(m, e, device=DEV)
        w = torch.randn(e, device=DEV)
        gu = torch.randn(m, 2 * f, device=DEV)
        for mode in (1, 2):
            t = bench(lambda: producers.rmsnorm(x, w, 1e-6, mode == 1))
            log(op="rmsnorm", m=m, mode=mode, ms=t)
            t = bench(lambda: producers.swiglu(gu, mode == 1))
            log(op="swiglu", m=m, mode=mode, ms=t, TBps=(gu.numel() * 4 + m * f * (2 + 4 * (mode == 1))) / t / 1e9)
        t = bench(lambda: producers.prepass(x))
        log(op="prepass", m=m, ms=t)


def project(res, ms):
    """7B prefill tok/s from the best matmul path per M (14 layers q6_K down, 14 q4_K),
    + 0.164 ms/layer attention at 3314 tokens scaled by (M/3314)^2, ignoring norms/rope."""
    for m in ms:
        best = {}
        for (shape, tname, mm), row in res.items():
            if mm == m:
                paths = {p: t for p, t in row.items() if not p.startswith("cublas")}
                best[(shape, tname)] = min(paths.values())
        per_layer = best[("qkv", "Q4_K")] + best[("o", "Q4_K")] + best[("gate_up", "Q4_K")]
        per_layer += 0.5 * (best[("down", "Q4_K")] + best.get(("down", "Q6_K"), best[("down", "Q4_K")]))
        attn = 0.164 * (m / 3314) ** 2
        total = 28 * (per_layer + attn)
        log(projection=m, linear_ms=28 * per_layer, attn_ms=28 * attn, tok_s=m / total * 1e3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU interpreter smoke run of this script")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--small", action="store_true", help="only few-row shapes: the fused GEMM's tiles and splits vs jit")
    ap.add_argument("--final", action="store_true", help="only the routed path vs cuBLAS (+ projection)")
    args = ap.parse_args()
    global DEV, bench
    torch.manual_seed(0)
    shapes, ms = SHAPES_7B, [16, 64, 128, 256, 512, 3314]
    cfgs = [(128, 128, 8, 3), (128, 256, 8, 3), (64, 128, 4, 4)]
    if args.tiny:
        DEV, shapes, ms, cfgs = "cpu", {"qkv": (48, 256), "o": (32, 256), "gate_up": (64, 256), "down": (32, 512)}, [16, 256], cfgs[:1]
        bench = _cpu_time
    else:
        print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    linalg.probe(DEV)
    log(out_dtype_mm=linalg.has_out_dtype(torch.device(DEV).type))
    t0 = time.time()
    try:
        if not args.skip_check:
            check_oracle()
            correctness(args.tiny)
            producers_check(args.tiny)
        log(phase="checks_done", s=time.time() - t0)
        if args.small:
            small_m([16] if args.tiny else [16, 64], args.tiny)
            return
        if args.final:
            final_timings([16, 512] if args.tiny else [16, 64, 128, 512, 3314], args.tiny)
            producer_timings(args.tiny)
            return
        res = timings(ms, cfgs, shapes)
        producer_timings(args.tiny)
        project(res, ms)
    finally:
        with open(os.path.join(args.out, "bench_prefill.json"), "w") as f:
            json.dump(LOG, f, indent=1, default=str)
        log(phase="end", s=time.time() - t0)


if __name__ == "__main__":
    sys.exit(main())
