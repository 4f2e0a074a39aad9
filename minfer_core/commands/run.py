"""``minfer run``: complete a prompt, streaming the text to stdout."""

from __future__ import annotations

import sys

from ..errors import UserError
from . import values
from .common import add_model_args, add_sampling_args, load_engine, log, read_prompt_file, sampler_config

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("run", help="generate text from a prompt",
                       description="Complete a prompt. The text streams to stdout; logs go to stderr.")
    add_model_args(p)
    p.add_argument("-p", "--prompt", type=values.utf8_text, help="prompt text (control tokens such as <|im_start|> are parsed)")
    p.add_argument("-f", "--file", metavar="FILE",
                   help="read the prompt from a file (one trailing newline dropped, as llama.cpp does)")
    p.add_argument("--no-bos", action="store_true", help="never prepend BOS")
    p.add_argument("--trace-dispatch", action="store_true", help="print each kernel label and how often it ran (stderr)")
    add_sampling_args(p)
    return p


def read_prompt(args) -> str:
    if args.prompt is not None and args.file:
        raise UserError("give the prompt with -p or -f, not both")
    if args.file:
        return read_prompt_file(args.file, "prompt")
    return args.prompt if args.prompt is not None else ""


def run(args) -> int:
    from ..solo import generate, solo_engine

    prompt = read_prompt(args)
    engine = load_engine(args, trace_dispatch=args.trace_dispatch)
    sampling = sampler_config(args, engine.gf.metadata)
    ids = engine.tok.encode(prompt, add_special=not args.no_bos, parse_special=True)
    if not ids:
        raise UserError("the prompt is empty and the model adds no BOS token: give a prompt (-p TEXT or -f FILE)")
    if len(ids) >= engine.model.n_ctx:
        raise UserError(f"prompt is {len(ids)} tokens, context is {engine.model.n_ctx}: raise -c")

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    be = solo_engine(engine)
    emit(prompt)
    gen = generate(be, ids, n_predict=args.n_predict, sampling=sampling, stop=args.stop, on_text=emit)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose:
        log(f"minfer: stop: {gen.stop_reason}; {engine.timings.summary()}")
    if args.trace_dispatch:
        log("dispatch labels (kernel: calls):")
        for label, n in sorted(engine.model.rt.counts.items()):
            log(f"  {label}: {n}")
    return 0
