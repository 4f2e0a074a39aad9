"""``minfer tokenize``: print the ids the model's own tokenizer gives a text (like llama-tokenize --ids)."""

from __future__ import annotations

import json
import sys

from ..errors import UserError
from . import values
from .common import read_text_file, read_text_stream


def add_parser(sub):
    p = sub.add_parser("tokenize", help="print the token ids of a text as a JSON list",
                       description="Tokenize TEXT with the model's vocabulary (only the file's metadata is read). "
                                   "Control tokens written in the text, such as <|im_start|>, are parsed by default.")
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("text", nargs="?", type=values.utf8_text, help="text to tokenize (use -f or --stdin instead for a file or a pipe)")
    p.add_argument("-f", "--file", metavar="FILE", help="read the text from a file, byte for byte")
    p.add_argument("--stdin", action="store_true", help="read the text from standard input")
    p.add_argument("--no-parse-special", action="store_true", help="treat control-token text as plain text")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS even where the model wants it")
    return p


def _read_text(args) -> str:
    """The text from its one source (llama-tokenize: the sources are mutually exclusive)."""
    if args.stdin + bool(args.file) + (args.text is not None) > 1:
        raise UserError("give one of TEXT, -f FILE and --stdin")
    if args.stdin:
        return read_text_stream(sys.stdin.buffer, "standard input")
    if args.file:
        return read_text_file(args.file, "text", newline="")
    if args.text is None:
        raise UserError("give TEXT, -f FILE or --stdin")
    return args.text


def run(args) -> int:
    from ..fetch import resolve_model
    from ..gguf_file import open_gguf
    from ..tokenizer import Tokenizer

    text = _read_text(args)
    path = resolve_model(args.model)
    try:
        tok = Tokenizer.from_metadata(open_gguf(path).metadata)
    except (ValueError, NotImplementedError, KeyError) as e:
        raise UserError(f"{path}: cannot build the tokenizer: {e}") from None
    ids = tok.encode(text, add_special=not args.no_bos, parse_special=not args.no_parse_special)
    print(json.dumps(ids))
    return 0
