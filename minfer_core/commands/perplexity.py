"""``minfer perplexity``: llama-perplexity's figure on a text file."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import UserError
from .common import add_model_args, load_engine, log

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama-perplexity's method)",
                       description="Cut the tokenized file into -c windows, score the second half of each, and print "
                                   "'Final estimate: PPL = X +/- Y'.")
    add_model_args(p, ctx_default=512)
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="text file to score")
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many windows (default: all)")
    return p


def run(args) -> int:
    from ..perplexity import perplexity

    try:
        text = Path(args.file).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"{args.file}: {e.strerror or e}") from None
    if args.ctx_size < 16:
        raise UserError("-c must be at least 16 for perplexity")
    engine = load_engine(args)
    log(f"perplexity: calculating perplexity over windows of {args.ctx_size} tokens")
    try:
        res = perplexity(engine, text, args.ctx_size, args.chunks,
                         on_window=lambda i, p: (sys.stdout.write(f"[{i}]{p:.4f},"), sys.stdout.flush()))
    except ValueError as e:
        raise UserError(f"{args.file}: {e}") from None
    sys.stdout.write("\n")
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.err:.5f}")
    return 0
