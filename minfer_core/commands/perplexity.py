"""``minfer perplexity``: llama-perplexity's figure on a text file."""

from __future__ import annotations

import sys

from ..errors import UserError
from . import values
from .common import add_model_args, load_engine, log, read_prompt_file, requested_ctx

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama-perplexity's method)",
                       description="Cut the tokenized file into -c windows, score the second half of each, and print "
                                   "'Final estimate: PPL = X +/- Y'.")
    add_model_args(p, ctx_default=512)
    p.add_argument("-f", "--file", required=True, metavar="FILE",
                   help="text file to score (one trailing newline dropped, as llama-perplexity does)")
    p.add_argument("--chunks", type=values.chunks, default=-1, help="score at most this many windows (default: -1 = all)")
    return p


def run(args) -> int:
    from ..perplexity import perplexity

    text = read_prompt_file(args.file, "text")
    if 0 < requested_ctx(args) < 16:
        raise UserError("-c must be at least 16 for perplexity (0 = the model's context)")
    engine = load_engine(args)
    n_ctx = engine.model.n_ctx  # -c, or the model's context for -c 0 or a smaller model
    log(f"perplexity: calculating perplexity over windows of {n_ctx} tokens")
    try:
        res = perplexity(engine, text, n_ctx, args.chunks,
                         on_window=lambda i, p: (sys.stdout.write(f"[{i}]{p:.4f},"), sys.stdout.flush()))
    except ValueError as e:
        raise UserError(f"{args.file}: {e}") from None
    sys.stdout.write("\n")
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.err:.5f}")
    return 0
