"""The ``minfer`` command: llama.cpp-style subcommands. Text on stdout, logs on stderr.

Every failure ends in one line on stderr: ``minfer: error: ...`` and status 2 for bad input,
``minfer: interrupted`` and 130 for Ctrl-C (from this module's first lines on), ``minfer:
terminated`` and 143 for SIGTERM (after cleanups ran), status 0 when the reader of
stdout goes away (``| head``), ``minfer: internal error: ...`` and 1 for a bug. ``-v`` adds the
traceback. This module imports only the standard library at the top, so nothing slow runs before
``main``'s handlers are in place.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "minfer":
    # the program (python -m minfer_core.cli, or the console script): a Ctrl-C before main's handlers
    # are in place is one line too; only the interpreter's own start-up, before this line, is not covered
    signal.signal(signal.SIGINT, lambda *_: (os.write(2, b"minfer: interrupted\n"), os._exit(130)))

import argparse
import importlib
import traceback

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


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that cleanups (temporary files, child processes) run."""


class UsageError(UserError):
    """A bad command line (unknown flag, bad value): argparse's message, on one line."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors raise ``UsageError`` instead of printing usage and exiting, so that
    they end like every other error (one line, status 2); subcommand parsers inherit it."""

    def error(self, message: str):
        raise UsageError(f"{message} (see '{self.prog} -h')")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="minfer",
        description="Run GGUF language models (qwen2, llama) with Triton kernels on NVIDIA GPUs or torch on the CPU.",
        epilog="Run 'minfer COMMAND -h' for a command's options. Without -m, commands use the default model "
               "(Qwen2.5-Coder-0.5B-Instruct Q4_K_M), fetched into ~/.cache/minfer on first use.",
    )
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the traceback with an error; with a command that loads a model, also log "
                             "load details and timings (same as the command's -v)")
    global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        mod = importlib.import_module(f".commands.{name}", __package__)
        p = mod.add_parser(sub)
        if getattr(mod, "ENGINE_OPTIONS", False):
            global_options(p, top=False)
        try:
            p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                           help="show the traceback with an error")
        except argparse.ArgumentError:
            pass  # the command has its own -v (add_model_args), which does the same and more
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


_guarded = False  # True while a command runs: only then does Ctrl-C raise KeyboardInterrupt (cleanups run)


def _on_sigint(signum, frame):
    if _guarded:
        raise KeyboardInterrupt
    os.write(2, b"minfer: interrupted\n")
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command; return the exit status (errors are printed, not raised)."""
    global _guarded
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv  # until the command line is parsed
    try:
        args = build_parser().parse_args(argv)  # imports the commands (and torch): a Ctrl-C here exits at once
        verbose = args.verbose
        _guarded = True
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's final flush
        return status
    except KeyboardInterrupt:
        _guarded = False
        _report("minfer: interrupted", verbose)
        return 130
    except Terminated:
        _report("minfer: terminated", verbose)
        return 143
    except BrokenPipeError:
        _drop_stdout()
        return 0
    except Exception as e:
        if _is_user_error(e):
            _report(f"minfer: error: {e}", verbose)
            return 2
        _report(f"minfer: internal error: {type(e).__name__}: {e}"
                + ("" if verbose else " (run with -v for the traceback)"), verbose)
        return 1
    finally:
        _guarded = False


def entry() -> None:
    """The ``minfer`` console script and ``python -m minfer_core.cli``: ``main`` in a process
    where a late Ctrl-C (while the interpreter shuts down) also ends quietly."""
    signal.signal(signal.SIGINT, _on_sigint)  # inside main a KeyboardInterrupt, outside it one line and 130
    signal.signal(signal.SIGTERM, _raise_terminated)
    status = main()
    sys.exit(status)


def _raise_terminated(signum, frame):
    raise Terminated()


def _report(line: str, verbose: bool) -> None:
    """The one line on stderr, after the traceback when ``-v`` is given."""
    if verbose:
        traceback.print_exc()
    print(" ".join(line.split("\n")), file=sys.stderr, flush=True)


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail on the closed pipe."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (tests capture stdout)
        pass


def _is_user_error(e: Exception) -> bool:
    from .gguf_file import ModelFileError
    return isinstance(e, (UserError, ModelFileError))


if __name__ == "__main__":
    entry()
