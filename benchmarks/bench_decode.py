"""Decode benchmark (GPU only): GEMV GB/s per real shape against a torch bf16 GEMV, split-KV
attention against SDPA, and a kernels-only decode step (all GEMVs + attention of every layer and
the output head, distinct weights per layer) replayed as one CUDA graph.

    python benchmarks/bench_decode.py [--sweep] [--json FILE]

``--sweep`` times several (BN, BB, num_warps) per shape and reports the best (``sweep.py`` sweeps
more widely). Times: ``triton.testing.do_bench`` medians (it flushes L2
between runs); the step graph: median of CUDA-event-timed replays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "mmq_triton"
sys.path[:0] = [str(PLUGIN / "tests"), str(PLUGIN)]

from gguf import GGMLQuantizationType as QT  # noqa: E402

from test_decode_gemv import check, make_weight  # noqa: E402

SHAPES_7B = [(QT.Q4_K, 4608, 3584), (QT.Q4_K, 3584, 3584), (QT.Q4_K, 37888, 3584), (QT.Q4_K, 3584, 18944),
             (QT.Q6_K, 3584, 18944), (QT.Q6_K, 152064, 3584)]
SHAPES_05B = [(QT.Q5_0, 1152, 896), (QT.Q5_0, 896, 896), (QT.Q5_0, 9728, 896), (QT.Q8_0, 128, 896),
              (QT.Q4_K, 896, 4864), (QT.Q6_K, 896, 4864), (QT.Q8_0, 151936, 896)]
DEVICE = "cuda"
#: (BN, BB, num_warps, DEQ, SPLIT) tried by --sweep (BB is lowered to what divides the row)
SWEEP_K = [(8, 2, 2, 0, 1), (8, 2, 2, 0, 2), (8, 2, 2, 0, 4), (8, 2, 2, 0, 8), (8, 2, 4, 0, 1),
           (16, 2, 4, 0, 1), (4, 8, 4, 0, 1),
           (16, 2, 4, 2, 1), (32, 2, 4, 2, 1), (16, 4, 4, 2, 1), (8, 2, 2, 2, 1), (16, 2, 4, 2, 2),
           (16, 2, 4, 2, 4), (32, 2, 4, 2, 4), (8, 2, 2, 2, 8), (32, 2, 8, 2, 1)]
SWEEP_L = [(8, 4, 2, 0, 4), (16, 4, 4, 0, 4), (8, 4, 2, 0, 2), (8, 4, 4, 0, 1), (16, 4, 4, 0, 1),
           (32, 4, 4, 0, 1), (4, 8, 4, 0, 1), (64, 4, 8, 0, 1)]
ATTN_CONFIGS = [(64, 4), (32, 4), (64, 2), (128, 4)]  # (BLOCK_S, num_warps)
ROTATE_BYTES = 256 << 20  # weight copies cycled through so that L2 (50 MB) cannot serve them


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e-3  # seconds


def graph_time(calls, reps: int = 20) -> float:
    """Median seconds per call of ``calls`` replayed as one CUDA graph (launch gaps included)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times[3:]) / len(calls)


def copy_bandwidth() -> float:
    x = torch.empty(1 << 28, dtype=torch.float32, device=DEVICE)
    y = torch.empty_like(x)
    x.normal_()
    return 2 * x.numel() * 4 / _bench(lambda: y.copy_(x))


def bench_gemv(qt, n, k, sweep: bool, gen) -> dict:
    """One shape: every config (graph-timed over rotating weight copies) and torch bf16."""
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton import decode, tiles

    ws = [make_weight(qt, n, k, gen, device=DEVICE)]
    nbytes = ws[0].raw.numel()
    copies = max(1, min(64, -(-ROTATE_BYTES // nbytes)))
    ws += [make_weight(qt, n, k, gen, device=DEVICE) for _ in range(copies - 1)]
    datas = [decode.prepare(w) for w in ws]
    x = torch.randn(1, k, generator=gen, device=DEVICE)
    w32 = dequantize(ws[0].raw, qt, k)
    nb = k // (256 if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 32)
    default = decode.decode_config(qt, n, k)
    configs = [default]
    if sweep:
        configs += SWEEP_K if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else SWEEP_L
    rows, seen = [], set()
    for bn, bb, warps, deq, split in configs:
        cfg = (bn, tiles.pow2_divisor(nb, bb), warps, deq, split)
        if cfg in seen or (bn > n and bn > 8):
            continue
        seen.add(cfg)
        fns = [decode.make_gemv(qt, d, None, n, k, cfg) for d in datas]
        err = check(fns[0](x), x, w32.double(), None)
        t = graph_time([lambda f=f: f(x) for f in fns] * max(1, 8 // copies))
        rows.append({"cfg": cfg, "s": t, "err": err})
    wbs = [dequantize(w.raw, qt, k).to(torch.bfloat16) for w in ws[:max(1, copies // 2)]]
    xb = x.to(torch.bfloat16)
    t_bf16 = graph_time([lambda wb=wb: torch.mm(xb, wb.t()) for wb in wbs] * max(1, 8 // len(wbs)))
    best = min(rows, key=lambda r: r["s"])
    del w32, wbs
    return {"type": qt.name, "n": n, "k": k, "bytes": nbytes + 4 * k + 4 * n, "default": rows[0], "best": best,
            "bf16_s": t_bf16, "bf16_bytes": 2 * n * k, "all": rows}


def bench_attention(h, hkv, d, nv, gen) -> dict:
    import torch.nn.functional as F

    from minfer_mmq_triton.ops.attention import attention_candidates

    ctx = 4096
    q = torch.randn(h, d, generator=gen, device=DEVICE)
    k = torch.randn(ctx, hkv, d, generator=gen, device=DEVICE).half()
    v = torch.randn(ctx, hkv, d, generator=gen, device=DEVICE).half()
    n = torch.tensor(nv, dtype=torch.int32, device=DEVICE)
    from minfer_mmq_triton.ops.attention import SplitKVAttention

    times = {}
    for bs, warps in ATTN_CONFIGS:
        fn = SplitKVAttention(bs, warps)
        times[(bs, warps)] = graph_time([lambda fn=fn: fn(q, k, v, n)] * 8)
    (c,) = attention_candidates("decode", None)
    t = graph_time([lambda: c.fn(q, k, v, n)] * 8)
    qs = q.half().view(1, h, 1, d)
    ks = k[:nv].transpose(0, 1).contiguous()[None]
    vs = v[:nv].transpose(0, 1).contiguous()[None]
    t_sdpa = graph_time([lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)] * 8)
    best = min(times, key=times.get)
    return {"h": h, "hkv": hkv, "d": d, "n_valid": nv, "s": t, "sdpa_s": t_sdpa, "bytes": 2 * nv * hkv * d * 2,
            "configs": {str(k): v for k, v in times.items()}, "best": best, "best_s": times[best]}


def _layers(model: str):
    """(qtype, n, k) per layer matmul, in call order, for the two benchmark models."""
    if model == "7b":
        per = lambda i: [(QT.Q4_K, 4608, 3584), "attn", (QT.Q4_K, 3584, 3584), (QT.Q4_K, 37888, 3584),
                         (QT.Q6_K if i % 2 == 0 else QT.Q4_K, 3584, 18944)]
        return [per(i) for i in range(28)], (QT.Q6_K, 152064, 3584), (28, 4, 128)
    per = lambda i: ([(QT.Q5_0, 1152, 896)] if i % 2 else [(QT.Q5_0, 896, 896), (QT.Q5_0, 128, 896),
                     (QT.Q8_0, 128, 896)]) + ["attn", (QT.Q5_0, 896, 896), (QT.Q5_0, 9728, 896),
                     (QT.Q6_K if i % 2 == 0 else QT.Q4_K, 896, 4864)]
    return [per(i) for i in range(24)], (QT.Q8_0, 151936, 896), (14, 2, 64)


def build_step(model: str, n_valid: int, gen, configs: dict) -> tuple[list, int]:
    """Kernels-only decode step: every GEMV and attention call of the model (distinct weights)."""
    from minfer_mmq_triton import decode
    from minfer_mmq_triton.ops.attention import attention_candidates

    layers, head, (h, hkv, d) = _layers(model)
    ctx = 4096
    calls, nbytes, xs = [], 0, {}
    attn = attention_candidates("decode", None)[0].fn
    q = torch.randn(h, d, generator=gen, device=DEVICE)
    nv = torch.tensor(n_valid, dtype=torch.int32, device=DEVICE)
    for spec in [s for layer in layers for s in layer] + [head]:
        if spec == "attn":
            kc = torch.randn(ctx, hkv, d, generator=gen, device=DEVICE).half()
            vc = torch.randn(ctx, hkv, d, generator=gen, device=DEVICE).half()
            calls.append(lambda kc=kc, vc=vc: attn(q, kc, vc, nv))
            nbytes += 2 * n_valid * hkv * d * 2
            continue
        qt, n, k = spec
        w = make_weight(qt, n, k, gen, device=DEVICE)
        data = decode.prepare(w)
        nbytes += w.raw.numel()
        if data is not w.raw:
            w.raw = None  # the bench keeps only what the kernel reads
        fn = decode.make_gemv(qt, data, None, n, k, configs.get((qt.name, n, k)))
        x = xs.setdefault(k, torch.randn(1, k, generator=gen, device=DEVICE))
        calls.append(lambda fn=fn, x=x: fn(x))
    return calls, nbytes


def bench_step(model: str, n_valid: int, gen, configs: dict) -> dict:
    """The step of :func:`build_step` captured as one CUDA graph; median replay time."""
    calls, nbytes = build_step(model, n_valid, gen, configs)

    t = graph_time(calls, reps=30) * len(calls)
    return {"model": model, "n_valid": n_valid, "kernels": len(calls), "bytes": nbytes, "s": t}


def run(sweep: bool, out_json: str | None) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    bw = copy_bandwidth()
    res = {"device": torch.cuda.get_device_name(), "copy_bw": bw, "gemv": [], "attn": [], "step": []}
    print(f"# {res['device']}  copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    print("| type | N x K | MiB | best cfg (BN,BB,warps,DEQ,SPLIT) | us | GB/s | % copy | default cfg | default us | bf16 torch us | bf16 GB/s | speedup vs bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for qt, n, k in SHAPES_7B + SHAPES_05B:
        r = bench_gemv(qt, n, k, sweep, gen)
        res["gemv"].append(r)
        b = r["best"]
        gbs = r["bytes"] / b["s"] / 1e9
        print(f"| {r['type']} | {n} x {k} | {r['bytes'] / 2**20:.1f} | {b['cfg']} | {b['s'] * 1e6:.1f} | {gbs:.0f} | "
              f"{gbs * 1e9 / bw * 100:.0f} | {r['default']['cfg']} | {r['default']['s'] * 1e6:.1f} | {r['bf16_s'] * 1e6:.1f} | "
              f"{r['bf16_bytes'] / r['bf16_s'] / 1e9:.0f} | {r['bf16_s'] / b['s']:.2f}x |", flush=True)
    print("\n| attention H/Hkv/D | n_valid | default us | GB/s | best (BLOCK_S, warps) | best us | SDPA f16 us |")
    print("|---|---|---|---|---|---|---|")
    for h, hkv, d in ((28, 4, 128), (14, 2, 64)):
        for nv in (128, 512, 4096):
            r = bench_attention(h, hkv, d, nv, gen)
            res["attn"].append(r)
            print(f"| {h}/{hkv}/{d} | {nv} | {r['s'] * 1e6:.1f} | {r['bytes'] / r['s'] / 1e9:.0f} | {r['best']} | "
                  f"{r['best_s'] * 1e6:.1f} | {r['sdpa_s'] * 1e6:.1f} |", flush=True)
    best = {(r["type"], r["n"], r["k"]): r["best"]["cfg"] for r in res["gemv"]}
    print("\n| step (kernels only, 1 graph) | configs | n_valid | kernels | MB read | ms | GB/s | tok/s bound |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ("7b", "0.5b"):
        for label, configs, nvs in (("shipped defaults", {}, (128, 4096)), ("best of sweep", best, (128,))):
            if label == "best of sweep" and not sweep:
                continue
            for nv in nvs:
                r = bench_step(model, nv, gen, configs)
                r["configs"] = label
                res["step"].append(r)
                print(f"| {model} | {label} | {nv} | {r['kernels']} | {r['bytes'] / 1e6:.0f} | {r['s'] * 1e3:.3f} | "
                      f"{r['bytes'] / r['s'] / 1e9:.0f} | {1 / r['s']:.0f} |", flush=True)
                torch.cuda.empty_cache()
    if out_json:
        Path(out_json).write_text(json.dumps(res, indent=1, default=str))
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    run(a.sweep, a.json)
