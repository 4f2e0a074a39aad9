"""Chat templates: the models' own templates against ChatML written out by hand, and the
transformers-compatible environment (whitespace control, tojson, raise_exception, sandbox)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from jinja2.exceptions import SecurityError, TemplateError

from minfer_core.chat_template import CHATML_TEMPLATE, default_template_messages, render_chat
from minfer_core.gguf_file import open_gguf
from minfer_core.tokenizer import Tokenizer

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TWO_TURNS = [
    {"role": "user", "content": "Write a haiku about GPUs."},
    {"role": "assistant", "content": "Silicon rivers"},
    {"role": "user", "content": "Now one about CPUs."},
]


def chatml(turns: list[tuple[str, str]], generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


@pytest.fixture(scope="module")
def qwen_meta(qwen_path):
    return open_gguf(qwen_path).metadata


@pytest.fixture(scope="module")
def smollm_meta(smollm_path):
    return open_gguf(smollm_path).metadata


@pytest.mark.parametrize("gen", [True, False])
def test_qwen_template_two_turns(qwen_meta, gen):
    template = qwen_meta["tokenizer.chat_template"]
    turns = [(m["role"], m["content"]) for m in TWO_TURNS]
    out = render_chat(template, TWO_TURNS, add_generation_prompt=gen)
    assert out == chatml([("system", QWEN_SYSTEM), *turns], gen)
    own = [{"role": "system", "content": "Be brief."}, *TWO_TURNS]
    assert render_chat(template, own, add_generation_prompt=gen) == chatml([("system", "Be brief."), *turns], gen)


@pytest.mark.parametrize("gen", [True, False])
def test_smollm_template_two_turns(smollm_meta, gen):
    template = smollm_meta["tokenizer.chat_template"]
    turns = [(m["role"], m["content"]) for m in TWO_TURNS]
    out = render_chat(template, TWO_TURNS, add_generation_prompt=gen)
    assert out == chatml([("system", SMOLLM_SYSTEM), *turns], gen)
    own = [{"role": "system", "content": "Be brief."}, *TWO_TURNS]
    assert render_chat(template, own, add_generation_prompt=gen) == chatml([("system", "Be brief."), *turns], gen)


def test_rendered_prompt_tokenizes_like_llama_cpp(qwen_meta):
    # llama-tokenize --ids on the rendered text (build and command: see tests/test_tokenizer.py)
    expected = [
        151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264, 10950, 17847,
        13, 151645, 198, 151644, 872, 198, 7985, 264, 6386, 38242, 911, 70403, 13, 151645, 198, 151644, 77091, 198,
        27571, 1924, 35517, 151645, 198, 151644, 872, 198, 7039, 825, 911, 65475, 13, 151645, 198, 151644, 77091, 198,
    ]
    text = render_chat(qwen_meta["tokenizer.chat_template"], TWO_TURNS)
    assert Tokenizer.from_metadata(qwen_meta).encode(text) == expected


def test_qwen_tools_use_plain_json(qwen_meta):
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function",
            "function": {"name": "get_weather", "description": "Weather <now> & 'later'", "parameters": params}}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
    msgs = [{"role": "user", "content": "Weather?"}, call, {"role": "tool", "content": "12 C"}]
    out = render_chat(qwen_meta["tokenizer.chat_template"], msgs, tools=[tool])
    assert "\n<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n</tools>" in out  # no HTML escaping
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
            "</tool_call><|im_end|>\n") in out
    assert out.endswith("<|im_start|>user\n<tool_response>\n12 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_environment_matches_transformers():
    # trim_blocks + lstrip_blocks: block tags leave no indentation or newline behind
    assert render_chat("  {% if true %}\nX\n  {% endif %}\nY", []) == "X\nY"
    # loop controls, the generation block, special tokens, extra variables
    tpl = ("{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
           "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{{ flavour }}{{ eos_token }}")
    assert render_chat(tpl, [{"content": "a"}, {"content": "b"}], bos_token="<s>", eos_token="</s>",
                       flavour="!") == "<s>a!</s>"
    assert render_chat("{{ tools is none }}", []) == "True"
    assert render_chat("{{ x | tojson(indent=2) }}", [], x={"k": [1]}) == '{\n  "k": [\n    1\n  ]\n}'
    assert render_chat("{{ strftime_now('%Y') }}", []) == str(datetime.now().year)
    with pytest.raises(TemplateError, match="no system"):
        render_chat("{{ raise_exception('no system') }}", [])


def test_sandbox():
    with pytest.raises(SecurityError):
        render_chat("{{ messages.append(1) }}", [])  # immutable sandbox
    with pytest.raises(SecurityError):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])


def test_helpers():
    msgs = default_template_messages("hi", system="sys")
    assert msgs == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert render_chat(CHATML_TEMPLATE, msgs) == chatml([("system", "sys"), ("user", "hi")], True)
    assert default_template_messages("hi") == [{"role": "user", "content": "hi"}]
