"""Chat templates (``tokenizer.chat_template``) rendered the way HF transformers renders them.

transformers compiles a template in jinja2's immutable sandbox with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension (``{% break %}``/``{% continue %}``) and a
``{% generation %}`` block tag, and adds a JSON filter that does not HTML-escape, plus the
``raise_exception`` and ``strftime_now`` globals. It renders with ``messages``, ``tools``,
``documents`` (``None`` when absent), ``add_generation_prompt`` and the special-token strings.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

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


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``json.dumps`` with transformers' defaults (no HTML escaping, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(template: str):
    """Compile once per template text (a syntax error raises ``jinja2.TemplateSyntaxError``)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra) -> str:
    """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) with a chat template.

    ``extra`` reaches the template as variables (``tools=[...]``, ``enable_thinking=False``, ...);
    ``tools`` and ``documents`` default to ``None`` as in transformers. A template's
    ``raise_exception(...)`` surfaces as ``jinja2.TemplateError``.
    """
    extra.setdefault("tools", None)
    extra.setdefault("documents", None)
    return compile_template(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             bos_token=bos_token, eos_token=eos_token, **extra)


def default_template_messages(prompt: str, system: str | None = None) -> list[dict]:
    """One user turn, preceded by a system turn when ``system`` is given."""
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": prompt}]
