"""``minfer synth TEMPLATE OUT.gguf``: a full-size random model from a layout template."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from minfer_core.errors import UserError

from . import values


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "synth", help="write a random model with a template's layout",
        description="Fill a layout template (a GGUF header, optionally .xz-compressed) with random, "
                    "well-scaled tensor data of each tensor's type. The header is kept byte for byte.")
    p.add_argument("template", type=Path, help="layout template (.gguf or .gguf.xz)")
    p.add_argument("out", type=Path, help="output .gguf path")
    p.add_argument("-s", "--seed", type=values.seed_fixed, default=0, help="random seed, 0 to 2**64-1 (default 0)")
    return p


def run(args: argparse.Namespace) -> int:
    """Bad templates raise ModelFileError (a UserError): the CLI prints one line."""
    from minfer_core.synth import synthesize

    t0 = time.perf_counter()
    try:
        synthesize(args.template, args.out, seed=args.seed, progress=sys.stderr.isatty())
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        raise UserError(f"{args.out}: cannot write: {e.strerror or e}") from None
    size = args.out.stat().st_size
    print(f"synth: wrote {args.out} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0
