"""Where the GPU time of a prefill and of a decode step goes (kernel table from torch.profiler).

    python benchmarks/profile_step.py MODEL.gguf [--pp 512] [--tokens 16] [--top 30] [--batch B,..]

Prints, for an eager prefill of ``--pp`` random tokens and for ``--tokens`` eager decode steps:
wall time, the sum of GPU kernel time, and the kernels taking the most GPU time. Then the
per-rep wall times of ``--reps`` prefills (to see whether the first ones run slower) and the
decode step as the engine runs it (CUDA graph replay) per token. With ``--batch``: for each B, the
batched engine's decode step with B sequences of ``--pp`` tokens (wall per step, the host's share,
and the kernel table; ``--sampled`` [``--host-sampling``]: requests that sample), and the step that
prefills all B prompts at once (wall, unprofiled and profiled, its kernel table and the torch ops
taking the most host time); ``--no-overlap`` reads each step back before launching the next.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minfer_core.throughput import _random_ids
from minfer_core.engine import Engine


def kernel_table(prof, top: int, per: int = 1) -> str:
    rows = []
    total = 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t <= 0 or e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        rows.append((t, e.count, e.key))
        total += t
    rows.sort(reverse=True)
    out = [f"  GPU kernel time: {total / 1e3 / per:.3f} ms per run"]
    for t, n, k in rows[:top]:
        out.append(f"  {t / 1e3 / per:8.3f} ms {n // per:5d}x  {k[:110]}")
    return "\n".join(out)


def host_table(prof, top: int) -> str:
    """The torch ops taking the most host time (self time, CPU side)."""
    rows = sorted(((e.self_cpu_time_total, e.count, e.key) for e in prof.key_averages()
                   if e.self_cpu_time_total > 0), reverse=True)
    total = sum(r[0] for r in rows)
    out = [f"  host time in torch ops: {total / 1e3:.3f} ms"]
    out += [f"  {t / 1e3:8.3f} ms {n:5d}x  {k[:110]}" for t, n, k in rows[:top]]
    return "\n".join(out)


def batched(eng, sizes: list[int], pp: int, top: int, overlap: bool, sampled: bool = False,
            device_sampling: bool = True) -> None:
    """The batched engine's decode-only steps at each batch size: wall, host time, kernels.
    ``sampled``: requests sample with the server's defaults (temperature 1, no filters), on the
    device or (``device_sampling=False``) on the host."""
    from minfer_core.batch_engine import BatchEngine, Request
    from minfer_core.sampling import SamplerConfig

    steps = 12
    per_seq = -(-(pp + 3 * steps + 8) // 16)
    for b in sizes:  # one engine per size, as ``minfer bench --batch`` has (its kernels follow ``parallel``)
        be = BatchEngine(eng, parallel=b, max_queue=b, n_blocks=b * per_seq, overlap=overlap,
                         device_sampling=device_sampling)
        be.sched.step_tokens = b * pp
        for i in range(b):
            knobs = SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i) if sampled else SamplerConfig(temp=0)
            be.submit(Request(_random_ids(eng, pp, 10 + i), 3 * steps + 4, knobs, ignore_eos=True))
        be.step()  # the prompts
        for _ in range(steps):  # warm-up: graph capture of this bucket
            be.step()
        torch.cuda.synchronize(eng.device)
        t0 = time.perf_counter()
        host = 0.0
        for _ in range(steps):
            h0 = time.perf_counter()
            be.step()
            host += time.perf_counter() - h0
        torch.cuda.synchronize(eng.device)
        wall = (time.perf_counter() - t0) / steps
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                be.step()
            torch.cuda.synchronize(eng.device)
        print(f"\n== batched decode step, B={b}: wall {wall * 1e3:.3f} ms ({b / wall:,.0f} tok/s), "
              f"step() returned after {host / steps * 1e3:.3f} ms on the host")
        print(kernel_table(prof, top, per=4))
        while be.step():
            pass
        prompt_step(be, eng, b, pp, top)
        del be
        torch.cuda.empty_cache()


def prompt_step(be, eng, b: int, pp: int, top: int) -> None:
    """The step prefilling ``b`` prompts of ``pp`` tokens at once: a warm-up, a timed and a
    profiled one."""
    from minfer_core.batch_engine import Request
    from minfer_core.sampling import SamplerConfig

    walls = []
    for rep in range(3):
        for i in range(b):
            be.submit(Request(_random_ids(eng, pp, 100 * rep + i), 2, SamplerConfig(temp=0), ignore_eos=True))
        torch.cuda.synchronize(eng.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) if rep == 2 else \
                contextlib.nullcontext() as prof:
            t0 = time.perf_counter()
            be.step()
            torch.cuda.synchronize(eng.device)
            walls.append(time.perf_counter() - t0)
        while be.step():
            pass
    print(f"\n== batched prompt step, B={b} x {pp}: wall {walls[1] * 1e3:.2f} ms ({b * pp / walls[1]:,.0f} tok/s), "
          f"profiled {walls[2] * 1e3:.2f} ms")
    print(kernel_table(prof, top))
    print(host_table(prof, top))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--batch", default="", help="batch sizes: profile the batched engine's decode step instead")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                    help="batched: launch each decode step before reading the last one back (the default)")
    ap.add_argument("--sampled", action="store_true",
                    help="batched: requests sample (temperature 1, no filters) instead of decoding greedily")
    ap.add_argument("--host-sampling", action="store_true", help="batched, --sampled: draw on the host")
    a = ap.parse_args()
    eng = Engine.load(a.model, progress=False)
    if a.batch:
        batched(eng, [int(b) for b in a.batch.split(",")], min(a.pp, 128), a.top, a.overlap, a.sampled,
                not a.host_sampling)
        return
    dev = eng.device
    ids = _random_ids(eng, a.pp, 1)

    # prefill: wall time per rep right after load (warm-up effects), then the profile
    for r in range(a.reps):
        eng.reset()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        eng.prefill(ids)
        torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        print(f"prefill rep {r}: {dt * 1e3:.2f} ms = {a.pp / dt:,.0f} tok/s", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        eng.reset()
        t0 = time.perf_counter()
        eng.prefill(ids)
        torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
    print(f"\n== prefill pp{a.pp} (eager, profiled): wall {dt * 1e3:.2f} ms")
    print(kernel_table(prof, a.top))

    # decode: eager steps (the model's own decode_step, no graph)
    model = eng.model
    toks = _random_ids(eng, a.tokens, 2)
    base = a.pp
    for i, t in enumerate(toks[:3]):  # warm-up
        model.decode_step(torch.tensor([t], device=dev), torch.tensor([base + i], device=dev))
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i, t in enumerate(toks):
            model.decode_step(torch.tensor([t], device=dev), torch.tensor([base + i], device=dev))
        torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
    print(f"\n== decode step (eager, profiled): wall {dt * 1e3 / a.tokens:.3f} ms per token")
    print(kernel_table(prof, a.top, per=a.tokens))

    # decode as the engine runs it (graph replay when cuda_graphs is in force)
    eng.reset()
    eng.prefill(ids[:8])
    for t in toks[:4]:
        eng.decode(t)
    torch.cuda.synchronize(dev)
    n = 64
    t0 = time.perf_counter()
    for i in range(n):
        eng.decode(toks[i % len(toks)])
    torch.cuda.synchronize(dev)
    dt = (time.perf_counter() - t0) / n
    print(f"\n== decode via engine ({eng.plan.decode_step.label if eng.plan.decode_step else 'eager'}): "
          f"{dt * 1e3:.3f} ms per token = {1 / dt:.1f} tok/s")


if __name__ == "__main__":
    main()
