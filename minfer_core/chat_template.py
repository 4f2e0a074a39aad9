"""Chat templates (``tokenizer.chat_template``) rendered the way HF transformers renders them.

transformers compiles a template in jinja2's immutable sandbox with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension (``{% break %}``/``{% continue %}``) and a
``{% generation %}`` block tag, and adds a JSON filter that does not HTML-escape, plus the
``raise_exception`` and ``strftime_now`` globals. It renders with ``messages``, ``tools``,
``documents`` (``None`` when absent), ``add_generation_prompt`` and the special-token strings.

A template comes from the model file, so a render is also bounded: CPU time (a tracer on the
template's compiled code stops any loop), the output's length, the size of strings, lists and
integers built on the way (operators, ``~``, calls and filters are checked before they allocate)
and recursion depth. Whatever a template raises is a ``jinja2.TemplateError`` or is described in
one line by ``describe_template_error``.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Bounds on one render: real templates take milliseconds and a few KB; hostile ones stop here.
MAX_RENDER_SECONDS = 2.0  # CPU time of the rendering thread
MAX_RENDER_CHARS = 8 << 20  # the output, and any string or list built on the way
MAX_INT_BITS = 256  # integer arithmetic (10 ** 10 ** 10 would run for ever)

# A plain ChatML template, for models whose file carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text in training templates):
    rendered as its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class TemplateLimitError(TemplateError):
    """A render went past a bound: time, output size, a value's size, or recursion depth."""


class TemplateRaised(TemplateError):
    """The template's own ``raise_exception(message)``."""


def _raise_exception(message: str):
    raise TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` with transformers' defaults (no HTML escaping, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else 0


def _bounded(value: Any) -> Any:
    if _size(value) > MAX_RENDER_CHARS:
        raise TemplateLimitError(f"a value of {_size(value)} items exceeds the limit of {MAX_RENDER_CHARS}")
    return value


def _check_args(args, kwargs) -> None:
    """Integer arguments are widths and counts (center, indent, ljust, slice, ...): cap them
    before anything is allocated."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and abs(a) > MAX_RENDER_CHARS:
            raise TemplateLimitError(f"argument {a} exceeds the limit of {MAX_RENDER_CHARS}")


def _check_format(fmt: Any) -> None:
    """A width or precision written in a format string ('%99999999s', '{:>99999999}') is capped too."""
    if isinstance(fmt, str) and any(int(n) > MAX_RENDER_CHARS for n in re.findall(r"\d{7,}", fmt)):
        raise TemplateLimitError(f"a width in format string {fmt[:40]!r} exceeds the limit of {MAX_RENDER_CHARS}")


def _check_binop(op: str, left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "**" and ints and right > 0 and left.bit_length() * right > MAX_INT_BITS:
        raise TemplateLimitError(f"{left} ** {right} exceeds {MAX_INT_BITS} bits")
    if op == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise TemplateLimitError(f"a product exceeds {MAX_INT_BITS} bits")
    if op == "*" and not ints:
        n = right if isinstance(right, int) else left if isinstance(left, int) else 0
        if n > 0 and (_size(left) + _size(right)) * n > MAX_RENDER_CHARS:
            raise TemplateLimitError(f"repeating a sequence {n} times exceeds the limit of {MAX_RENDER_CHARS}")
    if op == "+" and _size(left) + _size(right) > MAX_RENDER_CHARS:
        raise TemplateLimitError(f"a sum exceeds the limit of {MAX_RENDER_CHARS}")
    if op == "%":
        _check_format(left)


class _BoundedCodeGenerator(CodeGenerator):
    """``a ~ b`` goes through ``environment.bounded_concat`` (jinja would call ``"".join``)."""

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus size checks on operators, concatenation, calls and filters."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def call_binop(self, context, operator, left, right):
        _check_binop(operator, left, right)
        return _bounded(super().call_binop(context, operator, left, right))

    def bounded_concat(self, parts) -> str:
        parts = [str(p) for p in parts]
        if sum(map(len, parts)) > MAX_RENDER_CHARS:
            raise TemplateLimitError(f"a '~' concatenation exceeds the limit of {MAX_RENDER_CHARS}")
        return "".join(parts)

    def call(self, context, obj, /, *args, **kwargs):
        _check_args(args, kwargs)
        _check_format(getattr(getattr(obj, "__wrapped__", obj), "__self__", None))  # 'fmt'.format(...)
        return _bounded(super().call(context, obj, *args, **kwargs))


def _bounded_filter(f):
    @wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def filtered(*args, **kwargs):
        _check_args(args[1:], kwargs)
        if f.__name__ == "do_format":  # 'fmt'|format(...): the value is the format string
            _check_format(next((a for a in args if isinstance(a, str)), None))
        return _bounded(f(*args, **kwargs))
    return filtered


@lru_cache(maxsize=16)
def compile_template(template: str):
    """Compile once per template text (a syntax error raises ``jinja2.TemplateSyntaxError``)."""
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra) -> str:
    """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) with a chat template.

    ``extra`` reaches the template as variables (``tools=[...]``, ``enable_thinking=False``, ...);
    ``tools`` and ``documents`` default to ``None`` as in transformers. Every template problem is a
    ``jinja2.TemplateError``: syntax, sandbox (``SecurityError``), undefined names, the template's
    ``raise_exception(...)`` (``TemplateRaised``) and a render past the bounds above
    (``TemplateLimitError``: time, size, recursion, memory).
    """
    extra.setdefault("tools", None)
    extra.setdefault("documents", None)
    compiled = compile_template(template)
    out, n = [], 0
    with _deadline(MAX_RENDER_SECONDS):
        try:
            for piece in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                           bos_token=bos_token, eos_token=eos_token, **extra):
                n += len(piece)
                if n > MAX_RENDER_CHARS:
                    raise TemplateLimitError(f"the output exceeds {MAX_RENDER_CHARS} characters")
                out.append(piece)
        except RecursionError:
            raise TemplateLimitError("recursion too deep") from None
        except MemoryError:
            raise TemplateLimitError("out of memory") from None
    return "".join(out)


class _deadline:
    """Trace the template's own code (jinja compiles it to Python in '<template>') in this thread
    and raise ``TemplateLimitError`` on the first line executed after ``seconds`` of CPU time; any
    loop, however nested, runs lines. Other tracers (debuggers, coverage) are put back after."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        self.stop_at = time.thread_time() + self.seconds
        self.saved = sys.gettrace()
        sys.settrace(self._on_call)

    def __exit__(self, *exc):
        sys.settrace(self.saved)

    def _on_call(self, frame, event, arg):
        if frame.f_code.co_filename != "<template>":
            return None
        self._check()
        return self._on_line

    def _on_line(self, frame, event, arg):
        self._check()
        return self._on_line

    def _check(self):
        if time.thread_time() > self.stop_at:
            raise TemplateLimitError(f"rendering took more than {self.seconds:g} s")


def describe_template_error(e: BaseException) -> str:
    """One line for any exception a template compile or render raised, with the template line
    where it is known."""
    line = getattr(e, "lineno", None) if isinstance(e, TemplateSyntaxError) else None
    tb = e.__traceback__
    while tb is not None:  # jinja rewrites tracebacks so that template frames carry template lines
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    if isinstance(e, TemplateSyntaxError):
        what = f"syntax error: {e.message}"
    elif isinstance(e, SecurityError):
        what = f"refused by the sandbox: {e}"
    elif isinstance(e, TemplateRaised):
        what = f"the template refused the conversation: {e}"
    elif isinstance(e, UndefinedError):
        what = f"undefined value: {e}"
    elif isinstance(e, TemplateLimitError):
        what = f"render stopped: {e}"
    else:
        what = f"{type(e).__name__}: {e}"
    where = f"line {line}: " if line else ""
    return " ".join(f"{where}{what}".split("\n"))


def default_template_messages(prompt: str, system: str | None = None) -> list[dict]:
    """One user turn, preceded by a system turn when ``system`` is given."""
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": prompt}]
