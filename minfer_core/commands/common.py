"""Options and helpers shared by the commands that load a model."""

from __future__ import annotations

import argparse
import sys

from ..errors import UserError
from ..fetch import resolve_model
from ..sampling import SamplerConfig
from . import values


def add_model_args(p: argparse.ArgumentParser, ctx_default: int = 4096) -> None:
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("-c", "--ctx-size", type=values.ctx_size, default=None, metavar="N",
                   help=f"context size in tokens (default: {ctx_default}, or the model's if smaller; "
                        "0 = the model's; more than the model's is an error)")
    p.set_defaults(ctx_default=ctx_default)
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="log load details and timings; show tracebacks")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling", "A flag not given takes the model file's value (general.sampling.temp, "
                             "top_k, top_p, min_p, penalty_repeat, penalty_last_n) where it has one, as llama.cpp "
                             "does, else the default shown.")
    g.add_argument("-n", "--n-predict", type=values.n_predict, default=-1, metavar="N",
                   help="tokens to generate (default: -1 = until an end token or the context is full; "
                        "other negatives are refused)")
    g.add_argument("-s", "--seed", type=values.seed, default=-1, help="RNG seed, 0 to 2**64-1 (default: -1 = random)")
    add_sampler_flags(g, shown_defaults=True)
    g.add_argument("--stop", type=values.utf8_text, action="append", default=[], metavar="TEXT",
                   help="stop at this text (repeatable)")


def add_sampler_flags(g, shown_defaults: bool) -> None:
    """--temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, each None when not given
    (:func:`given_sampling`); ``shown_defaults``: the help names SamplerConfig's defaults."""
    d = (lambda text: f" (default: {text})") if shown_defaults else (lambda text: f" ({text.split('; ', 1)[-1]})")
    g.add_argument("--temp", type=values.temperature, help="temperature >= 0" + d("0.8; 0 = greedy"))
    g.add_argument("--top-k", type=values.top_k, help="top-k" + d("40; 0 = off"))
    g.add_argument("--top-p", type=values.top_p, help="top-p in (0, 1]" + d("0.95; 1.0 = off"))
    g.add_argument("--min-p", type=values.min_p, help="min-p in [0, 1]" + d("0.05; 0 = off"))
    g.add_argument("--repeat-penalty", type=values.repeat_penalty, help="repeat penalty > 0" + d("1.0 = off"))
    g.add_argument("--repeat-last-n", type=values.repeat_last_n,
                   help="tokens the repeat penalty looks back at" + d("64; 0 = off, -1 = the whole context"))


def given_sampling(args) -> dict:
    """The sampler flags the user gave, as SamplerConfig fields."""
    from ..sampling import FILE_KEYS

    return {f: getattr(args, f) for f in FILE_KEYS if getattr(args, f, None) is not None}


def requested_ctx(args) -> int:
    """-c as given, or the command's default when it was not."""
    return args.ctx_size if args.ctx_size is not None else args.ctx_default


def model_context(path) -> int:
    """The model's training context in tokens, from the file's metadata."""
    from ..model_config import config_from_gguf
    from ..gguf_file import open_gguf

    return config_from_gguf(open_gguf(path)).ctx_len


def check_fits(path, need: int, what: str) -> None:
    """``what`` needs ``need`` tokens of context: refused before loading when the model has fewer."""
    limit = model_context(path)
    if need > limit:
        raise UserError(f"{what} needs a context of {need} tokens, more than {path}'s {limit}")


def check_ctx(args, path) -> None:
    """An explicit -c larger than the model's training context is refused (the default is clamped)."""
    if not args.ctx_size:
        return
    limit = model_context(path)
    if args.ctx_size > limit:
        raise UserError(f"-c {args.ctx_size} is more than {path}'s context of {limit} tokens: "
                        f"give -c {limit} or less (0 = the model's)")


def sampler_config(args, metadata: dict | None = None) -> SamplerConfig:
    """The sampling flags given, then the model file's ``general.sampling.*`` values (``metadata``; a
    refused one is said on stderr), then SamplerConfig's defaults."""
    from ..engine import log
    from ..sampling import file_defaults

    found, refused = file_defaults(metadata or {})
    for line in refused:
        log(f"minfer: {line}")
    try:
        return SamplerConfig(**{**found, **given_sampling(args)}, seed=args.seed)
    except ValueError as e:
        raise UserError(str(e)) from None


def load_engine(args, trace_dispatch: bool = False):
    """Resolve -m, load the engine with the global plugin options; log the plan on -v."""
    from ..cli import blocked_plugins
    from ..engine import Engine

    path = resolve_model(args.model)
    check_ctx(args, path)
    engine = Engine.load(path, backend=getattr(args, "backend", None), policy=getattr(args, "policy", None),
                         blocked=blocked_plugins(args), device=getattr(args, "device", None), n_ctx=requested_ctx(args),
                         trace_plugins=getattr(args, "trace_plugins", False), trace_dispatch=trace_dispatch,
                         progress=sys.stderr.isatty())
    if getattr(args, "verbose", False):
        c = engine.cfg
        log(f"minfer: {path.name}: {c.arch}, {c.n_layers} layers, {c.n_embd} wide, {c.n_heads}/{c.n_kv_heads} heads, "
            f"vocab {c.vocab_size}; device {engine.device}; n_ctx {engine.model.n_ctx}; loaded in {engine.timings.load_s:.2f} s")
        log(f"minfer: fuse mode {engine.plan.fuse_mode}" + (f" ({engine.plan.fuse_reason})" if engine.plan.fuse_reason else ""))
    return engine


def read_text_file(path: str, what: str, newline: str | None = None) -> str:
    """A UTF-8 text file, or a UserError naming the file and what is wrong with it."""
    try:
        with open(path, encoding="utf-8", newline=newline) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: cannot read {what}: not valid UTF-8 (byte 0x{e.object[e.start]:02x} at offset "
                        f"{e.start}); convert it to UTF-8 (e.g. iconv -t UTF-8)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read {what}: {e.strerror or e}") from None


def read_prompt_file(path: str, what: str) -> str:
    """A -f file as llama.cpp's -f reads it: the text as it is (line ends untranslated), less one trailing newline."""
    text = read_text_file(path, what, newline="")
    return text[:-1] if text.endswith("\n") else text


def read_text_stream(stream, what: str) -> str:
    """All of a binary stream (stdin's buffer) as UTF-8, or a UserError saying where it is not."""
    data = stream.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what}: not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "convert it to UTF-8 (e.g. iconv -t UTF-8)") from None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
