"""Decode at depth (GPU): the split-KV attention kernel alone against its bandwidth bound, and
whole-model tgN after an N-token prompt, alone and after prompt tests in the same process.

    python benchmarks/decode_depth.py MODEL.gguf [--depths 0,1024,4096] [-n 128] [--parts ...]

Part 1 times ``SplitKVAttention`` on ``--layers`` layers' caches in turn (the model's head layout;
by default as many as the model has, so that K/V come from HBM as in a decode step: one layer's
cache, 2-17 MB, stays in L2 across calls) for each valid length, for a few BLOCK_S / warps / split
counts, and prints microseconds a layer and the K/V bytes read per second. Part 2 prints tgN at each
depth (prompt untimed). Part 3 repeats tgN at depth 0 after pp512 and pp3314 have run, then after a
3 s pause, with the SM clock before each, to find what a figure inherits from the tests before it.
Part ``paged`` times the batched engine's paged attention (``PagedDecodeAttention``) for B sequences
of a few lengths, split count, BLOCK_S and the combine's dims a program and warps (random block
tables, the model's head layout).
``--tiles BS,W ...``: tgN at each depth per tile of the decode attention, a fresh load each.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch

from minfer_core.throughput import _random_ids, _sync, run_test, time_gen
from minfer_core.engine import Engine


def clocks() -> str:
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True)
    return r.stdout.strip()


def time_cuda(fn, iters: int = 200) -> float:
    """Microseconds per call, replayed from a CUDA graph of ``iters`` calls."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (5 * iters) * 1e6


def attention_alone(cfg, depths: list[int], n_ctx: int, layers: int) -> None:
    from minfer_mmq_triton.ops import attention as A

    h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    dev = torch.device("cuda")
    q = torch.randn(h, d, device=dev)
    ks = [torch.randn(n_ctx, hkv, d, device=dev, dtype=torch.float16) for _ in range(layers)]
    vs = [torch.randn(n_ctx, hkv, d, device=dev, dtype=torch.float16) for _ in range(layers)]
    print(f"## attention alone: H={h} Hkv={hkv} D={d}, cache {n_ctx} rows, {layers} layers' caches in turn "
          "(us a layer)")
    print("| n_valid | block_s | warps | nsplit | dc | ch | us | GB/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    configs = [(64, 4, None, 32, 16), (64, 4, 128, 128, 16), (64, 4, 64, 32, 16), (64, 4, 32, 32, 16),
               (64, 4, 256, 32, 32), (128, 8, 64, 32, 16), (64, 4, 128, 64, 32), (32, 4, 128, 32, 16)]
    for nv in depths:
        nvt = torch.tensor(max(nv, 1), dtype=torch.int32, device=dev)
        for bs, nw, ns, dc, ch in configs:
            att = A.SplitKVAttention(block_s=bs, num_warps=nw, nsplit=ns, dc=dc, ch=ch)
            us = time_cuda(lambda: [att(q, k, v, nvt) for k, v in zip(ks, vs)], max(1, 200 // layers)) / layers
            used = ns or A.n_splits(hkv, dev)
            gbs = max(nv, 1) * hkv * d * 2 * 2 / us / 1e3
            print(f"| {nv} | {bs} | {nw} | {used} | {dc} | {ch} | {us:.2f} | {gbs:.0f} |")


def paged_alone(cfg, batches: list[int], lengths: list[int]) -> None:
    from minfer_mmq_triton.ops.paged_attention import PagedDecodeAttention

    h, hkv, d, page = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, 16
    dev = torch.device("cuda")
    print(f"## paged attention alone: H={h} Hkv={hkv} D={d}, pages of {page}")
    print("| B | n_valid | nsplit | block_s | combine dims, warps | us | GB/s |")
    print("|---:|---:|---:|---:|---|---:|---:|")
    configs = [(16, 64, 32, 4), (4, 64, 32, 4), (4, 64, 128, 4), (4, 64, 128, 2), (4, 64, 128, 1), (16, 64, 128, 2)]
    for b in batches:
        for nv in lengths:
            per = -(-nv // page)
            k = torch.randn(b * per + 1, page, hkv, d, device=dev, dtype=torch.float16)
            v = torch.randn_like(k)
            tables = torch.randperm(b * per, device=dev, dtype=torch.int32).view(b, per)
            lens = torch.full((b,), nv, dtype=torch.int32, device=dev)
            q = torch.randn(b, h, d, device=dev)
            for ns, bs, dc, cw in configs:
                att = PagedDecodeAttention(nsplit=ns, block_s=bs, dc=dc, combine_warps=cw)
                us = time_cuda(lambda: att(q, k, v, tables, lens), iters=50)
                gbs = b * nv * hkv * d * 2 * 2 / us / 1e3
                print(f"| {b} | {nv} | {ns} | {bs} | {dc}, {cw} | {us:.2f} | {gbs:.0f} |", flush=True)


def tg_at_depth(eng: Engine, n: int, depth: int, reps: int = 3) -> list[float]:
    prompt = _random_ids(eng, depth, 7) if depth else []
    out = []
    for r in range(reps + 1):
        eng.reset()
        if prompt:
            eng.prefill(prompt)
        ids = _random_ids(eng, n, r)
        _sync(eng)
        t0 = time.perf_counter()
        for t in ids:
            eng.decode(t)
        _sync(eng)
        if r:  # the first run warms up
            out.append(n / (time.perf_counter() - t0))
    return out


def tiles_at_depth(model: str, tiles: list[tuple[int, int]], depths: list[int], n: int) -> None:
    """tgN at each depth with the decode attention at each ``(BLOCK_S, num_warps)``, a fresh load each."""
    from minfer_mmq_triton.ops import attention as A

    print("| BLOCK_S, warps | " + " | ".join(f"tg{n} @ d{d}" for d in depths) + " |")
    print("|---|" + "---:|" * len(depths))
    for tile in tiles + tiles[:1]:
        A.DECODE_TILE = tile
        eng = Engine.load(model, progress=False, n_ctx=max(depths) + n + 64)
        cells = [" / ".join(f"{x:.1f}" for x in tg_at_depth(eng, n, d)) for d in depths]
        print(f"| {tile[0]}, {tile[1]} | " + " | ".join(cells) + " |", flush=True)
        del eng
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depths", default="0,1024,4096")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--parts", default="attention,depth,history", help="which parts to run")
    ap.add_argument("--layers", type=int, default=0,
                    help="attention part: caches timed in turn (default: the model's layers; 1: one, L2-warm)")
    ap.add_argument("--tiles", nargs="*", default=[],
                    help="tgN at each depth per BLOCK_S,WARPS of the decode attention (a fresh load each, then the "
                         "first again), instead of the parts")
    a = ap.parse_args()
    parts = a.parts.split(",")
    depths = [int(x) for x in a.depths.split(",")]
    if a.tiles:
        return tiles_at_depth(a.model, [tuple(int(v) for v in t.split(",")) for t in a.tiles], depths, a.n)
    eng = Engine.load(a.model, progress=False, n_ctx=max(depths) + a.n + 64)
    if "attention" in parts:
        attention_alone(eng.cfg, [1, 512, 1024, 2048, 4096, 4160, 8192], max(8192, eng.model.n_ctx),
                        a.layers or eng.cfg.n_layers)
    if "paged" in parts:
        paged_alone(eng.cfg, [1, 32, 128], [200, 1024, 4096])
    print("\n## tg at depth")
    for d in depths if "depth" in parts else []:
        ts = tg_at_depth(eng, a.n, d)
        print(f"tg{a.n} @ d{d}: " + ", ".join(f"{x:.1f}" for x in ts))
    if "history" not in parts:
        return
    print("\n## history (fresh loads)")
    del eng
    torch.cuda.empty_cache()
    eng = Engine.load(a.model, progress=False, n_ctx=a.n + 16)
    print(f"n_ctx {a.n + 16}: tg alone:", [f"{x:.1f}" for x in run_test(eng, "tg", a.n, 3).samples_ts])
    del eng
    torch.cuda.empty_cache()
    eng = Engine.load(a.model, progress=False, n_ctx=3314 + 64)
    print(f"clocks {clocks()}")
    print("n_ctx 3378: tg alone:", [f"{x:.1f}" for x in run_test(eng, "tg", a.n, 3).samples_ts])
    for n in (512, 3314):
        print(f"pp{n}:", [f"{x:.0f}" for x in run_test(eng, "pp", n, 3).samples_ts])
    print(f"clocks {clocks()}")
    print("tg after pp:", [f"{x:.1f}" for x in run_test(eng, "tg", a.n, 3).samples_ts])
    time.sleep(3)
    print(f"clocks {clocks()}")
    print("tg after 3 s:", [f"{a.n / time_gen(eng, a.n, seed=r):.1f}" for r in range(3)])
    torch.cuda.empty_cache()
    print("tg after empty_cache:", [f"{a.n / time_gen(eng, a.n, seed=r):.1f}" for r in range(3)])


if __name__ == "__main__":
    main()
