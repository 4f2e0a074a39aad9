"""Host-side cost of an eager prefill (no CUDA graph): wall time per prompt and a cProfile table.

    python benchmarks/host_profile.py MODEL.gguf [--pp 512]

Loads with the ``cuda_graphs`` plugin blocked, warms up, times three prefills, then profiles one
(the Python functions taking the most time on the host).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from minfer_core.bench import _random_ids
from minfer_core.engine import Engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pp", type=int, default=512)
    a = ap.parse_args()
    eng = Engine.load(a.model, blocked=["cuda_graphs"], progress=False)
    ids = _random_ids(eng, a.pp, 1)
    for _ in range(3):
        eng.reset()
        eng.prefill(ids)
    for _ in range(3):
        eng.reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eng.prefill(ids)
        torch.cuda.synchronize()
        print(f"eager prefill {a.pp}: {(time.perf_counter() - t0) * 1e3:.1f} ms", flush=True)
    pr = cProfile.Profile()
    eng.reset()
    pr.enable()
    eng.prefill(ids)
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
