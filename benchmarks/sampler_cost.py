"""What one sampled token costs the host (CPU): ``Sampler`` on a row of 151,936 logits (Qwen2's
vocabulary), flat (N(0, 3)) and peaked (20 tokens 25 above the rest), per set of knobs.

    python benchmarks/sampler_cost.py [--against REV] [--engine B]

``--against REV``: the same rows through ``minfer_core/sampling.py`` as it was at git revision REV,
side by side in this process. The batched engine samples every non-greedy row this way, one after
another, in each step. ``--engine B``: also the host time of a decode step of a B-sequence batched
engine whose requests all sample with the server's defaults (a tiny synthesized model on the CPU,
its forward replaced by fixed 151,936-wide logits), with each sampler.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minfer_core import sampling

KNOBS = {"server default (temp 1, no top-k/p, min-p)": dict(temp=1.0, top_k=0, top_p=1.0, min_p=0.0),
         "CLI default (temp 0.8, top-k 40, top-p 0.95, min-p 0.05)":
             dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05),
         "temp 0.7, top-p 0.9": dict(temp=0.7, top_k=0, top_p=0.9, min_p=0.0),
         "temp 1, top-p 0.95, min-p 0.05": dict(temp=1.0, top_k=0, top_p=0.95, min_p=0.05)}


def at_revision(rev: str):
    """``minfer_core.sampling`` as it was at ``rev``, imported under another name."""
    root = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "show", f"{rev}:minfer_core/sampling.py"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "sampling_at_rev.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("sampling_at_rev", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def ms_per_token(mod, knobs: dict, x: torch.Tensor, reps: int = 30) -> float:
    s = mod.Sampler(mod.SamplerConfig(seed=1, **knobs))
    s(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        s(x)
    return (time.perf_counter() - t0) / reps * 1e3


def engine_step_ms(mods, b: int) -> None:
    """Host ms per decode step of a ``b``-sequence engine sampling with the server's defaults."""
    from gguf import GGMLQuantizationType as QT

    import minfer_core.batch_engine as batch_engine
    from minfer_core.batch_engine import BatchEngine, Request
    from minfer_core.engine import Engine
    from minfer_core.synth import synthesize, tiny_layout, write_layout

    d = Path(tempfile.mkdtemp())
    write_layout(d / "t.layout.gguf", *tiny_layout("qwen2", QT.Q8_0))
    synthesize(d / "t.layout.gguf", d / "t.gguf", progress=False)
    eng = Engine.load(d / "t.gguf", backend="reference", device="cpu", n_ctx=512, progress=False)
    logits = torch.randn(256, 151936, generator=torch.Generator().manual_seed(2)) * 3
    logits[:, eng.tok.vocab_size:] = -float("inf")  # the tiny model's ids index the first columns
    for name, mod in mods:
        batch_engine.Sampler = mod.Sampler
        be = BatchEngine(eng, parallel=b, max_queue=b, n_blocks=b * 32, graphs=False)
        be._decode_step = lambda inputs: logits[:inputs.shape[0]]
        for i in range(b):
            be.submit(Request(list(range(1 + i, 60 + i)), 400, sampling.SamplerConfig(
                temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=i), ignore_eos=True))
        for _ in range(30):  # the prompts, then decode-only steps
            be.step()
        t0 = time.perf_counter()
        for _ in range(10):
            be.step()
        print(f"{name}: {(time.perf_counter() - t0) / 10 * 1e3:.1f} ms of host time a decode step at B={b}")
    batch_engine.Sampler = sampling.Sampler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", help="a git revision whose sampler runs beside today's")
    ap.add_argument("--engine", type=int, default=0, help="also a B-sequence engine's decode step")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(151936, generator=g) * 3
    peaked = torch.randn(151936, generator=g) * 3
    peaked[:20] += 25
    mods = [(args.against, at_revision(args.against))] if args.against else []
    mods.append(("now", sampling))
    print("| knobs | logits | " + " | ".join(f"{name} (ms)" for name, _ in mods) + " |")
    print("|---|---|" + "---:|" * len(mods))
    for label, knobs in KNOBS.items():
        for rows, x in (("flat", flat), ("peaked", peaked)):
            print(f"| {label} | {rows} | " + " | ".join(f"{ms_per_token(m, knobs, x):.2f}" for _, m in mods) + " |",
                  flush=True)
    if args.engine:
        engine_step_ms(mods, args.engine)


if __name__ == "__main__":
    sys.exit(main())
