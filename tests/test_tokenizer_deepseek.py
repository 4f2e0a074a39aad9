"""The ``deepseek-r1-qwen`` pre-tokenizer, on the vocabulary of DeepSeek-R1-Distill-Qwen-7B (the
7B layout template's header carries the whole tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minfer_core.synth import read_template
from minfer_core.tokenizer import Tokenizer

TEMPLATE = Path(__file__).parent.parent / "models" / "qwen2-7b-q4_k_m.layout.gguf.xz"

# Expected ids from llama.cpp's llama-tokenize (llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f,
# as vendored in llama-cpp-python 0.3.36), run on `minfer synth` of this template:
#   llama-tokenize -m 7b.gguf -f case.txt --ids --no-escape --log-disable
CASES = [
    ("Hello, world! ünïcödé 12345",
     [151646, 9707, 11, 1879, 0, 10489, 77, 37572, 66, 2956, 128505, 220, 16, 17, 18, 19, 20]),
    ("<think>\nOkay, let's see: 3*7=21.</think>",
     [151646, 151648, 198, 32313, 11, 1077, 594, 1490, 25, 220, 18, 9, 22, 28, 17, 16, 13, 151649]),
    ("  def f(x):\n    return x**2  # 你好",
     [151646, 220, 707, 282, 2075, 982, 262, 470, 856, 334, 17, 220, 671, 220, 108386]),
    ("<｜User｜>What is 2+2?<｜Assistant｜>",
     [151646, 151644, 3838, 374, 220, 17, 10, 17, 30, 151645]),
    ("I'm don't  12345678   spaces\ttab\nnewline🙂",
     [151646, 40, 2776, 1513, 944, 220, 220, 16, 17, 18, 19, 20, 21, 22, 23, 256, 12621, 58149, 198, 89202, 145080]),
]


@pytest.fixture(scope="module")
def tok():
    _, header = read_template(TEMPLATE)
    return Tokenizer.from_metadata(header.metadata)


def test_pre_tokenizer_name(tok):
    assert tok.pre == "deepseek-r1-qwen" and tok.add_bos


@pytest.mark.parametrize("text,ids", CASES)
def test_matches_llama_tokenize(tok, text, ids):
    assert tok.encode(text) == ids
