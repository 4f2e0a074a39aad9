"""The ``minfer`` command: llama.cpp-style subcommands. Text on stdout, logs on stderr."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .errors import UserError

COMMANDS = ("run", "chat", "perplexity", "bench", "parity", "tokenize", "pull", "gates", "plugins", "synth", "serve")


def global_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """Options accepted both before and after the subcommand (``minfer --backend X run`` and
    ``minfer run --backend X``)."""
    d = {} if top else {"default": argparse.SUPPRESS}
    g = parser.add_argument_group("plugins and policy")
    g.add_argument("--backend", metavar="NAME", **d,
                   help="put this plugin first for all work it can serve (reference or an installed plugin; see minfer plugins); "
                        "an error if it cannot run here")
    g.add_argument("--policy", metavar="FILE", **d,
                   help="gate policy YAML (default: $MINFER_POLICY or configs/gates.yaml)")
    flags = ("-p", "--plugin") if top else ("--plugin",)  # after a subcommand, -p is the prompt
    g.add_argument(*flags, metavar="no:NAME", action="append", **({"default": []} if top else d),
                   help="block a plugin, e.g. -p no:cuda_graphs (repeatable)")
    g.add_argument("--trace-plugins", action="store_true", **({"default": False} if top else d),
                   help="print hook calls and which candidate won each decision (stderr)")
    g.add_argument("--device", metavar="DEV", **d, help="cpu or cuda[:N] (default: cuda when available)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minfer",
        description="Run GGUF language models (qwen2, llama) with Triton kernels on NVIDIA GPUs or torch on the CPU.",
        epilog="Run 'minfer COMMAND -h' for a command's options. Without -m, commands use the default model "
               "(Qwen2.5-Coder-0.5B-Instruct Q4_K_M), fetched into ~/.cache/minfer on first use.",
    )
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        mod = importlib.import_module(f".commands.{name}", __package__)
        p = mod.add_parser(sub)
        if getattr(mod, "ENGINE_OPTIONS", False):
            global_options(p, top=False)
        p.set_defaults(_run=mod.run)
    return parser


def blocked_plugins(args) -> list[str]:
    """Names from ``-p no:NAME``; anything else is a user error."""
    out = []
    for item in getattr(args, "plugin", []) or []:
        if not item.startswith("no:") or len(item) <= 3:
            raise UserError(f"-p expects no:NAME to block a plugin, got '{item}'")
        out.append(item[3:])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # user-facing errors end in one line
        if _is_user_error(e):
            print(f"minfer: error: {e}", file=sys.stderr)
            return 2
        raise


def _is_user_error(e: Exception) -> bool:
    from .gguf_file import ModelFileError
    return isinstance(e, (UserError, ModelFileError))


if __name__ == "__main__":
    sys.exit(main())
