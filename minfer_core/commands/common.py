"""Options and helpers shared by the commands that load a model."""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from ..fetch import resolve_model
from ..sampling import SamplerConfig


def add_model_args(p: argparse.ArgumentParser, ctx_default: int = 4096) -> None:
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("-c", "--ctx-size", type=int, default=ctx_default, metavar="N",
                   help=f"context size in tokens (default: {ctx_default}; 0 = the model's)")
    p.add_argument("-v", "--verbose", action="store_true", help="log load details and timings")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N", help="tokens to generate (default: -1 = until end or context full)")
    g.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed (default: -1 = random)")
    g.add_argument("--temp", type=float, default=0.8, help="temperature (default: 0.8; 0 = greedy)")
    g.add_argument("--top-k", type=int, default=40, help="top-k (default: 40; 0 = off)")
    g.add_argument("--top-p", type=float, default=0.95, help="top-p (default: 0.95; 1.0 = off)")
    g.add_argument("--min-p", type=float, default=0.05, help="min-p (default: 0.05; 0 = off)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="repeat penalty (default: 1.0 = off)")
    g.add_argument("--repeat-last-n", type=int, default=64, help="tokens the repeat penalty looks back at (default: 64)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")


def sampler_config(args) -> SamplerConfig:
    try:
        return SamplerConfig(temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed)
    except ValueError as e:
        raise UserError(str(e)) from None


def load_engine(args, trace_dispatch: bool = False):
    """Resolve -m, load the engine with the global plugin options; log the plan on -v."""
    from ..cli import blocked_plugins
    from ..engine import Engine

    path = resolve_model(args.model)
    engine = Engine.load(path, backend=getattr(args, "backend", None), policy=getattr(args, "policy", None),
                         blocked=blocked_plugins(args), device=getattr(args, "device", None), n_ctx=args.ctx_size,
                         trace_plugins=getattr(args, "trace_plugins", False), trace_dispatch=trace_dispatch)
    if getattr(args, "verbose", False):
        c = engine.cfg
        log(f"minfer: {path.name}: {c.arch}, {c.n_layers} layers, {c.n_embd} wide, {c.n_heads}/{c.n_kv_heads} heads, "
            f"vocab {c.vocab_size}; device {engine.device}; n_ctx {engine.model.n_ctx}; loaded in {engine.timings.load_s:.2f} s")
        log(f"minfer: fuse mode {engine.plan.fuse_mode}" + (f" ({engine.plan.fuse_reason})" if engine.plan.fuse_reason else ""))
    return engine


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
