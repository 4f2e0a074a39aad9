"""``minfer chat``: a multi-turn conversation on stdin/stdout using the model's chat template."""

from __future__ import annotations

import itertools
import sys

from ..errors import UserError
from . import values
from .common import add_model_args, add_sampling_args, load_engine, log, sampler_config

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("chat", help="multi-turn chat with the model's chat template",
                       description="Chat on stdin/stdout. Each line you type is a user turn; an empty line or EOF "
                                   "(Ctrl-D) ends. The KV cache is kept between turns: mostly new tokens are prefilled.")
    add_model_args(p)
    p.add_argument("--system", "-sys", type=values.utf8_text, metavar="TEXT", help="system message")
    add_sampling_args(p)
    return p


def run(args) -> int:
    from ..chat_session import ChatSession
    from ..solo import solo_engine

    engine = load_engine(args)
    sampling = sampler_config(args, engine.gf.metadata)
    session = ChatSession(solo_engine(engine), system=args.system, sampling=sampling)
    interactive = sys.stdin.isatty()
    for turn in itertools.count(1):
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = _read_line(turn)
        if not line or not line.strip():
            break
        session.send(line.rstrip("\n"), n_predict=args.n_predict, stop=args.stop,
                     on_text=lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        sys.stdout.write("\n")
        sys.stdout.flush()
        if args.verbose:
            t = engine.timings
            reused = t.prompt_tokens - engine.last_prefill
            log(f"minfer: turn: {t.prompt_tokens} prompt tokens, {reused} from the KV cache, "
                f"{engine.last_prefill} prefilled; {t.summary()}")
    return 0


def _read_line(turn: int) -> str:
    """One line of stdin as UTF-8 ('' at EOF)."""
    raw = sys.stdin.buffer.readline()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"standard input, line {turn}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}); type or pipe UTF-8 text") from None
