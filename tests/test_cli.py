"""The ``minfer`` command as a user meets it: bad input ends in one line and status 2, results on
stdout, logs on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as QT

from test_config import build  # tiny synthesized models (tests/test_config.py)
from test_gguf_file import patch_tensor_info


def minfer(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minfer_core.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(res: subprocess.CompletedProcess, *fragments: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert res.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny"))


def test_help_explains_commands():
    res = minfer("--help")
    assert res.returncode == 0
    for cmd in ("run", "chat", "perplexity", "bench", "tokenize", "gates", "plugins", "pull", "synth"):
        assert cmd in res.stdout


def test_run_tiny_model_end_to_end(tiny):
    res = minfer("--backend", "reference", "run", "-m", str(tiny), "-p", "ab", "-n", "4", "--temp", "0",
                 "--trace-dispatch")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ab")
    assert "ref.q8_0" in res.stderr  # dispatch labels go to stderr


def test_not_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model\n")
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p))


def test_missing_file(tmp_path):
    p = tmp_path / "nope.gguf"
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p))


def test_truncated(tmp_path, tiny):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "truncated")


def test_unknown_tensor_type(tmp_path, tiny):
    p = tmp_path / "badtype.gguf"
    p.write_bytes(tiny.read_bytes())
    patch_tensor_info(p, "blk.0.attn_q.weight", type_id=99)
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "blk.0.attn_q.weight")


def test_missing_key(tmp_path):
    p = build(tmp_path, edit=lambda md, ts: md.pop("qwen2.block_count"))
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "qwen2.block_count")


def test_wrong_shape(tmp_path):
    def edit(md, ts):
        i = next(i for i, t in enumerate(ts) if t[0] == "blk.1.attn_k.weight")
        ts[i] = ("blk.1.attn_k.weight", QT.Q8_0, (64, 256))
    p = build(tmp_path, edit=edit)
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "blk.1.attn_k.weight")


def test_unsupported_architecture(tmp_path):
    p = build(tmp_path, "gpt2")
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "gpt2")


def test_bad_flags(tiny):
    assert_one_line_error(minfer("run", "-m", str(tiny), "-p", "x", "--top-p", "0"), "top-p")
    assert_one_line_error(minfer("--backend", "nosuch", "run", "-m", str(tiny), "-p", "x"), "nosuch")
    assert_one_line_error(minfer("-p", "cuda_graphs", "run", "-m", str(tiny), "-p", "x"), "no:NAME")


def test_tokenize_prints_llama_cpp_ids(qwen_path):
    res = minfer("tokenize", "-m", str(qwen_path), "Hello, world!")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [9707, 11, 1879, 0]


def test_pull_prints_cached_path(smollm_path):
    res = minfer("pull", "smollm2-135m")
    assert res.returncode == 0 and res.stdout.strip() == str(smollm_path)


def test_bad_device_and_tokenizer(tmp_path):
    if not __import__("torch").cuda.is_available():
        tiny = build(tmp_path)
        assert_one_line_error(minfer("--device", "cuda", "run", "-m", str(tiny), "-p", "x"), "cuda")
    p = build(tmp_path, edit=lambda md, ts: md.update({"tokenizer.ggml.pre": "no-such-pre"}), name="pre")
    assert_one_line_error(minfer("run", "-m", str(p), "-p", "x"), str(p), "no-such-pre")


def test_bench_and_parity_on_a_tiny_model(tiny):
    res = minfer("--backend", "reference", "bench", "-m", str(tiny), "-p", "32", "-n", "4", "-r", "2", "-o", "json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["test"] for r in rows] == ["pp32", "tg4"]
    assert all(len(r["samples_ts"]) == 2 and r["avg_ts"] > 0 for r in rows)
    md = minfer("--backend", "reference", "bench", "-m", str(tiny), "-p", "32", "-n", "0", "-r", "1")
    assert md.returncode == 0 and "| pp32 |" in md.stdout and " ± " in md.stdout
    par = minfer("parity", "-m", str(tiny), "-p", "ab", "-n", "6", "--config", "backend=reference",
                 "--config", "backend=reference,MINFER_MMQ=0")
    assert par.returncode == 0, par.stderr
    assert par.stdout.count("identical") == 2


def test_no_progress_bar_when_stderr_is_not_a_terminal(tiny):
    # as minfer run, pull and synth: a bar's carriage returns only on a terminal, not in a log file
    bench = minfer("--backend", "reference", "bench", "-m", str(tiny), "-p", "16", "-n", "0", "-r", "1")
    parity = minfer("parity", "-m", str(tiny), "-n", "2", "--config", "backend=reference",
                    "--config", "backend=reference")
    for res in (bench, parity):
        assert res.returncode == 0, res.stderr
        assert "\r" not in res.stderr and "load:" not in res.stderr, res.stderr


def test_parity_refuses_what_does_not_fit_or_is_not_utf8(tiny):
    # the tiny model holds 512 tokens: a stream that cannot fit is a user error, not 'context full'
    res = minfer("parity", "-m", str(tiny), "-n", "600", "--config", "backend=reference",
                 "--config", "backend=reference")
    assert_one_line_error(res, "-n 600", "512")
    assert_one_line_error(minfer("parity", "-m", str(tiny), "-n", "600", "--batch", "2"), "-n 600", "512")
    bad = subprocess.run([sys.executable.encode(), b"-m", b"minfer_core.cli", b"parity", b"-m", str(tiny).encode(),
                          b"-p", b"caf\xe9"], capture_output=True)
    err = bad.stderr.decode()
    assert bad.returncode == 2 and err.count("\n") == 1 and "not valid UTF-8 (byte 0xe9" in err, err


def test_prompt_file_is_read_as_llama_cpp_reads_it(tmp_path):
    """llama.cpp's -f (common/arg.cpp, the "-f/--file" option and read_file) takes the file's bytes as
    they are and drops one trailing newline: llama-completion's prompt from b"Hello\\r\\nworld\\n\\n" is
    "Hello\\r\\nworld\\n". minfer read it with newlines translated and the last one kept."""
    from argparse import Namespace

    from minfer_core.commands.run import read_prompt

    f = tmp_path / "prompt.txt"
    f.write_bytes(b"Hello\r\nworld\n\n")
    assert read_prompt(Namespace(prompt=None, file=str(f))) == "Hello\r\nworld\n"
    f.write_bytes(b"no newline")
    assert read_prompt(Namespace(prompt=None, file=str(f))) == "no newline"


def test_perplexity_file_loses_its_trailing_newline(tiny, tmp_path):
    """llama-perplexity tokenizes the -f text less one trailing newline (common/arg.cpp, the "-f/--file"
    option), so a file and the same file plus a final newline give the same windows and figures: 47
    one-letter tokens make 2 windows of -c 16 (perplexity(): n_chunk_max = tokens / n_ctx), not 3."""
    text = ("abcdefghijklmnopqrstuvwxyz" * 2)[:47]  # a token a letter in the tiny vocabulary
    bare, ended = tmp_path / "bare.txt", tmp_path / "ended.txt"
    bare.write_text(text)
    ended.write_text(text + "\n")
    out = [minfer("--backend", "reference", "perplexity", "-m", str(tiny), "-f", str(f), "-c", "16")
           for f in (bare, ended)]
    for res in out:
        assert res.returncode == 0, res.stderr
    assert out[0].stdout.startswith("[1]") and "[2]" in out[0].stdout and "[3]" not in out[0].stdout
    assert out[1].stdout == out[0].stdout
