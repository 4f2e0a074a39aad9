"""Hostile or broken chat templates (``tokenizer.chat_template``): every problem ends in one line
naming the model file and the template's problem, and no render runs or grows without bound."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError

from minfer_core import chat_template as chat
from minfer_core.chat_template import TemplateLimitError, describe_template_error, render_chat
from minfer_core.cli import main
from test_config import build  # tiny synthesized models (tests/test_config.py)

HI = [{"role": "user", "content": "hi"}]
CHATML = chat.CHATML_TEMPLATE


@pytest.fixture
def fast_deadline(monkeypatch):
    monkeypatch.setattr(chat, "MAX_RENDER_SECONDS", 0.3)


RUNAWAY = {  # templates that would run for hours or allocate gigabytes without the bounds
    "nested loops": "{% set r = range(99999)|list %}{% for a in r %}{% for b in r %}{% for c in r %}"
                    "{% endfor %}{% endfor %}{% endfor %}",
    "endless output": "{% for a in range(99999) %}{% for b in range(99999) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
    "string repeat": "{{ 'x' * 10 ** 9 }}",
    "list repeat": "{{ ([1] * 1000000) * 1000000 }}",
    "power": "{{ 10 ** 10 ** 10 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "concat doubling": "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "plus doubling": "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "center filter": "{{ 'x' | center(10 ** 9) }}",
    "ljust method": "{{ 'x'.ljust(10 ** 9) }}",
    "percent width": "{{ '%1000000000s' % 1 }}",
    "format filter width": "{{ '%1000000000s' | format(1) }}",
    "str.format width": "{{ '{:>1000000000}'.format(1) }}",
    "macro recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "loop recursion": "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
}


@pytest.mark.parametrize("name", list(RUNAWAY))
def test_runaway_templates_stop(fast_deadline, name):
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError):
        render_chat(RUNAWAY[name], HI)
    assert time.perf_counter() - t0 < 20  # CPU-time deadline 0.3 s; wall time is loose on a busy machine


def test_bounds_leave_real_templates_alone(qwen_path):
    from minfer_core.gguf_file import open_gguf
    template = open_gguf(qwen_path).metadata["tokenizer.chat_template"]
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 2000} for i in range(50)]
    text = render_chat(template, long)
    assert text.count("<|im_start|>") == 52  # default system turn + 50 turns + the generation prompt
    assert render_chat("{{ '%5s|%s' | format(1, 'a') }}{{ '{:>3}'.format(7) }}{{ 2 ** 10 }}", []) == "    1|a  71024"


def test_deadline_puts_back_an_existing_tracer(fast_deadline):
    def tracer(frame, event, arg):
        return None
    sys.settrace(tracer)
    try:
        with pytest.raises(TemplateLimitError):
            render_chat(RUNAWAY["nested loops"], HI)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


@pytest.mark.parametrize("template,exc,fragment", [
    ("{% for m in messages %}\n{{ m.content }\n{% endfor %}", TemplateSyntaxError, "line 2: syntax error"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", SecurityError, "refused by the sandbox"),
    ("a\n{{ messages.append(1) }}", SecurityError, "refused by the sandbox"),
    ("{{ nothing.here }}", UndefinedError, "'nothing' is undefined"),
    ("\n\n{{ raise_exception('System role not supported') }}",
     chat.TemplateRaised, "line 3: the template refused the conversation: System role not supported"),
])
def test_error_descriptions(template, exc, fragment):
    with pytest.raises(exc) as ei:
        render_chat(template, HI)
    text = describe_template_error(ei.value)
    assert fragment in text and "\n" not in text, text


def _model_with(tmp_path, template, name="m"):
    return build(tmp_path, edit=lambda md, ts: md.update({"tokenizer.chat_template": template}), name=name)


def _chat(monkeypatch, capsys, model, stdin=b"hi\n"):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    status = main(["--backend", "reference", "chat", "-m", str(model), "-n", "3", "--temp", "0"])
    return status, capsys.readouterr()


@pytest.mark.parametrize("template,fragment", [
    ("{% for m in messages %}{{ m.content }", "syntax error"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused by the sandbox"),
    ("{{ messages[0].nope.deeper }}", "undefined"),
    ("{{ raise_exception('only user turns') }}", "the template refused the conversation: only user turns"),
    ("{% if false %}x{% endif %}", "rendered nothing"),
    (RUNAWAY["nested loops"], "rendering took more than 0.3 s"),
    (RUNAWAY["string repeat"], "exceeds the limit"),
    (RUNAWAY["macro recursion"], "recursion too deep"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
])
def test_chat_command_reports_the_template_and_the_file(tmp_path, monkeypatch, capsys, fast_deadline, template,
                                                       fragment):
    model = _model_with(tmp_path, template)
    status, captured = _chat(monkeypatch, capsys, model)
    lines = captured.err.strip().splitlines()
    assert status == 2 and len(lines) == 1, captured.err
    assert lines[0].startswith(f"minfer: error: {model}: chat template: ") and fragment in lines[0], lines[0]


def test_a_good_template_still_chats(tmp_path, monkeypatch, capsys):
    status, captured = _chat(monkeypatch, capsys, _model_with(tmp_path, CHATML), stdin=b"ab\nab\n")
    assert status == 0, captured.err
    assert captured.out.count("\n") == 2  # two replies, one line each


def test_non_text_template(tmp_path, monkeypatch, capsys):
    status, captured = _chat(monkeypatch, capsys, _model_with(tmp_path, [1, 2]))
    assert status == 2 and "tokenizer.chat_template is a list" in captured.err


def test_real_process_prints_one_line(tmp_path):
    model = _model_with(tmp_path, "{% for %}")
    res = subprocess.run([sys.executable, "-m", "minfer_core.cli", "chat", "-m", str(model)], input="hi\n",
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{model}: chat template: line 1: syntax error" in res.stderr
