"""argparse ``type=`` checks shared by every command.

Each returns a callable that parses one command-line value exactly (integers in range, finite
floats in range, text that is valid UTF-8) or raises ``argparse.ArgumentTypeError``; argparse then
reports ``argument --flag: <what is accepted>, got 'VALUE'`` and the CLI prints it as one line.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64-bit seeds


def integer(lo: int | None = None, hi: int | None = None, what: str = "") -> Callable[[str], int]:
    """An integer in [lo, hi]; ``what`` explains special values, e.g. '-1 = all'."""
    expect = "an integer" + _bounds(lo, hi, False, False) + (f" ({what})" if what else "")

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expect}, got {_shown(text)}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {expect}, got {_shown(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False,
           what: str = "") -> Callable[[str], float]:
    """A finite float in the range (open or closed at each end); nan and inf are refused."""
    expect = "a finite number" + _bounds(lo, hi, lo_open, hi_open) + (f" ({what})" if what else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expect}, got {_shown(text)}") from None
        bad = not math.isfinite(value)
        bad = bad or (lo is not None and (value <= lo if lo_open else value < lo))
        bad = bad or (hi is not None and (value >= hi if hi_open else value > hi))
        if bad:
            raise argparse.ArgumentTypeError(f"expected {expect}, got {_shown(text)}")
        return value

    parse.__name__ = "number"
    return parse


def utf8_text(text: str) -> str:
    """Text that encodes to UTF-8: bytes that are not UTF-8 reach Python as lone surrogates
    (``surrogateescape``) and would fail later, deep in the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 (byte 0x{bad[0]:02x} at character {e.start}): pass UTF-8 text") from None
    return text


def _bounds(lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {hi}"
    return ""


def _shown(text: str) -> str:
    """The offending value, quoted and cut short, printable even when it is not UTF-8."""
    cut = text if len(text) <= 40 else text[:40] + "..."
    return repr(cut.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


# The values the commands take, each named once.
n_predict = integer(-1, what="-1 = until an end token or the context is full")
ctx_size = integer(0, what="0 = the model's context")
seed = integer(-1, SEED_MAX, what="-1 = random")
seed_fixed = integer(0, SEED_MAX)
temperature = number(0, what="0 = greedy")
top_k = integer(0, what="0 = off")
top_p = number(0, 1, lo_open=True, what="1 = off")
min_p = number(0, 1, what="0 = off")
repeat_penalty = number(0, lo_open=True, what="1 = off")
repeat_last_n = integer(-1, what="-1 = the whole context, 0 = off")
positive = integer(1)
count = integer(0)


def counts(text: str) -> list[int]:
    """A comma-separated list of integers >= 0 (``512,3314``), as llama-bench takes them."""
    one = integer(0)
    try:
        return [one(x) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {_shown(text)}") from None


def chunks(text: str) -> int:
    """perplexity --chunks: -1 (all windows) or a window count >= 1."""
    value = integer(-1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected -1 (all windows) or a count >= 1, got {_shown(text)}")
    return value
