"""The CLI's engine against the single-stream engine, one process, the same prompts: for each prompt
length, ``Engine.generate(ids, N)`` from an empty cache and then ``minfer_core.solo.generate`` on a
solo engine over the same model (what ``minfer run`` does), each prompt three times with a different
second token (no prefix-cache hit; the first two runs of a bucket compile or capture its graphs).
Prints prompt and generation tok/s, and whether the greedy tokens are the same.

    python benchmarks/bench_solo.py /tmp/7b.gguf [--lengths 128,512,663] [-n 256]
"""

from __future__ import annotations

import argparse

from minfer_core.engine import Engine
from minfer_core.sampling import SamplerConfig
from minfer_core.solo import generate, solo_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--lengths", default="128,512,663")
    ap.add_argument("-n", type=int, default=256)
    args = ap.parse_args()
    eng = Engine.load(args.model, n_ctx=4096, progress=False)
    greedy = SamplerConfig(temp=0)
    base = eng.tok.encode("The history of computing is long and full of turns. " * 60, add_special=True)
    prompts = [(n, r, [base[0], 1000 + 7 * n + r] + base[1:n - 1])
               for n in map(int, args.lengths.split(",")) for r in range(3)]
    want = {}
    for n, r, ids in prompts:
        eng.reset()
        want[n, r] = eng.generate(ids, args.n, greedy).tokens
        print(f"engine n={len(ids)} run {r + 1}: {eng.timings.summary()}", flush=True)
    be = solo_engine(eng)
    for n, r, ids in prompts:
        got = generate(be, ids, args.n, greedy).tokens
        print(f"solo   n={len(ids)} run {r + 1}: same tokens {got == want[n, r]}, fell back "
              f"{be.solo_fallbacks} steps; {eng.timings.summary()}", flush=True)


if __name__ == "__main__":
    main()
