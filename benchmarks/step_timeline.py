"""Where a graph-replayed decode step spends its time, kernel by kernel (GPU).

    python benchmarks/step_timeline.py MODEL.gguf [--tokens 16] [--top 40] [--depth N]

Profiles ``--tokens`` decode steps as the engine runs them (CUDA graph replay, PDL when in force)
with torch.profiler, then orders the step's kernels by start time. With PDL a kernel starts
before its predecessor ends and waits, so its own duration says little; what it costs the step is
how much later it ends than the kernel before it (``end_i - end_(i-1)``). Prints that cost summed
per kernel name and grid, per token, largest first, and the step's total.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from minfer_core.throughput import _random_ids
from minfer_core.engine import Engine


def kernels(trace_path: str) -> list[tuple[float, float, str]]:
    """(start us, end us, name [grid]) of every GPU kernel in a chrome trace, by start time."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    out = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        grid = e.get("args", {}).get("grid", "")
        out.append((float(e["ts"]), float(e["ts"]) + float(e["dur"]), f"{e['name'][:48]} {grid}"))
    out.sort()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--depth", type=int, default=8, help="tokens in the cache before the profiled steps")
    a = ap.parse_args()
    eng = Engine.load(a.model, progress=False, n_ctx=a.depth + a.tokens + 32)
    ids = _random_ids(eng, a.depth, 1)
    toks = _random_ids(eng, a.tokens + 4, 2)
    eng.prefill(ids)
    for t in toks[:4]:  # capture and warm up
        eng.decode(t)
    torch.cuda.synchronize(eng.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for t in toks[4:]:
            eng.decode(t)
        torch.cuda.synchronize(eng.device)
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    ks = kernels(path)
    cost: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    prev_end = None
    for start, end, name in ks:
        gap = end - (start if prev_end is None or start > prev_end else prev_end)
        if prev_end is not None and start > prev_end:
            cost["(idle between kernels)"] += start - prev_end
        cost[name] += max(gap, 0.0)
        count[name] += 1
        prev_end = max(end, prev_end or end)
    span = ks[-1][1] - ks[0][0]
    n = a.tokens
    print(f"{len(ks) / n:.0f} kernels per token, {span / n:.1f} us per token from first start to last end")
    for name, c in sorted(cost.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{c / n:9.2f} us {count[name] // n if name in count else 0:4d}x  {name}")


if __name__ == "__main__":
    main()
