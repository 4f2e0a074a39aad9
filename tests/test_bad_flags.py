"""Bad command-line values, bad text and signals: every one ends in one line on stderr, status 2 (130
for Ctrl-C, 0 for a closed stdout), and no traceback unless -v."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from minfer_core.commands import plugins as plugins_command
from minfer_core.cli import build_parser, main
from minfer_core.sampling import Sampler, SamplerConfig
from test_config import build  # tiny synthesized models (tests/test_config.py)

MINFER = [sys.executable, "-m", "minfer_core.cli"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tiny"))  # context_length 512


def one_line(capsys, status: int, *fragments: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


BAD_VALUES = [  # (flag, value, what the message must say)
    ("--temp", "nan", "finite"), ("--temp", "inf", "finite"), ("--temp", "-0.5", ">= 0"),
    ("--top-p", "nan", "(0, 1]"), ("--top-p", "0", "(0, 1]"), ("--top-p", "1.01", "(0, 1]"),
    ("--min-p", "-0.1", "[0, 1]"), ("--min-p", "2", "[0, 1]"), ("--min-p", "nan", "finite"),
    ("--repeat-penalty", "nan", "finite"), ("--repeat-penalty", "0", "> 0"), ("--repeat-penalty", "-1", "> 0"),
    ("--repeat-last-n", "-2", ">= -1"), ("--repeat-last-n", "1.5", "integer"),
    ("--top-k", "-1", ">= 0"),
    ("-n", "-2", "-1 = until an end token"), ("-n", "ten", "integer"),
    ("-c", "-1", ">= 0"), ("-c", "1e3", "integer"),
    ("-s", str(2**64), "18446744073709551615"), ("-s", "-2", "-1 = random"), ("-s", "0x10", "integer"),
]


@pytest.mark.parametrize("flag,value,fragment", BAD_VALUES)
def test_bad_sampling_and_context_values(capsys, flag, value, fragment):
    assert main(["run", "-m", "unused.gguf", "-p", "x", flag, value]) == 2
    line = one_line(capsys, 2, fragment, repr(value))
    assert line.startswith("minfer: error: argument ") and flag in line


@pytest.mark.parametrize("argv,fragment", [
    (["bench", "-r", "0"], "-r/--repetitions"),
    (["perplexity", "-f", "x.txt", "--chunks", "0"], "--chunks"),
    (["parity", "-n", "-1"], "-n/--n-predict"),
    (["synth", "a.gguf", "b.gguf", "-s", "-1"], "-s/--seed"),
    (["chat", "--temp", "nan"], "--temp"),
    (["run", "--no-such-flag"], "--no-such-flag"),
    (["no-such-command"], "invalid choice"),
])
def test_other_commands_share_the_checks(capsys, argv, fragment):
    assert main(argv) == 2
    one_line(capsys, 2, fragment)


def test_edge_values_are_accepted():
    args = build_parser().parse_args(["run", "--temp", "0", "--top-p", "1", "--min-p", "1", "-n", "-1", "-c", "0",
                                      "-s", str(2**64 - 1), "--repeat-last-n", "-1", "--repeat-penalty", "1e-3"])
    assert (args.temp, args.top_p, args.min_p, args.n_predict, args.ctx_size, args.seed, args.repeat_last_n) == \
        (0.0, 1.0, 1.0, -1, 0, 2**64 - 1, -1)
    assert build_parser().parse_args(["perplexity", "-f", "x", "--chunks", "-1"]).chunks == -1


def test_sampler_config_refuses_what_the_cli_refuses():
    for bad in (dict(temp=float("nan")), dict(temp=-1.0), dict(top_p=float("inf")), dict(min_p=1.5),
                dict(repeat_penalty=float("nan")), dict(repeat_last_n=-2), dict(seed=2**64)):
        with pytest.raises(ValueError):
            SamplerConfig(**bad)


def test_repeat_last_n_follows_llama_cpp():
    # llama.cpp: 0 disables the penalty, -1 looks back over everything
    logits = torch.tensor([5.0, 4.0, 0.0])
    history = [0, 2, 2, 2]  # token 0 only at the start
    pick = lambda n: Sampler(SamplerConfig(temp=0, repeat_penalty=100.0, repeat_last_n=n))(logits, history)
    assert pick(0) == 0  # no penalty: the best logit wins
    assert pick(3) == 0  # token 0 is outside the last 3
    assert pick(-1) == 1  # the whole history: token 0 is penalized to 0.05 < 4.0


def test_extreme_temperature_and_penalty_sample_without_nan():
    logits = torch.tensor([3.0, 2.9, -1.0])
    tiny_t = {Sampler(SamplerConfig(temp=1e-300, top_k=0, top_p=1.0, min_p=0.0, seed=s))(logits) for s in range(10)}
    assert tiny_t == {0}  # a vanishing temperature is the argmax
    flat = [-float("inf")] * 3
    assert Sampler(SamplerConfig(temp=1.0, seed=1))(torch.tensor(flat)) in (0, 1, 2)


def test_context_larger_than_the_model_is_refused(tiny, capsys):
    assert main(["run", "-m", str(tiny), "-p", "x", "-c", "513"]) == 2
    one_line(capsys, 2, str(tiny), "512", "-c 513")
    assert main(["--backend", "reference", "run", "-m", str(tiny), "-p", "ab", "-c", "512", "-n", "2", "--temp", "0"]) == 0
    assert main(["--backend", "reference", "run", "-m", str(tiny), "-p", "ab", "-n", "2", "--temp", "0",
                 "-s", str(2**64 - 1)]) == 0  # the default -c 4096 is clamped to the model's 512
    text = tiny.parent / "text.txt"
    text.write_text("the " * 100)
    assert main(["perplexity", "-m", str(tiny), "-f", str(text), "-c", "8"]) == 2
    one_line(capsys, 2, "-c must be at least 16")


def test_non_utf8_argv_and_files(tiny, tmp_path):
    bad = b"caf\xe9"  # latin-1, not UTF-8
    for argv in ([b"run", b"-m", str(tiny).encode(), b"-p", bad],
                 [b"run", b"-m", str(tiny).encode(), b"-p", b"x", b"--stop", bad],
                 [b"tokenize", b"-m", str(tiny).encode(), bad]):
        res = subprocess.run([sys.executable.encode(), b"-m", b"minfer_core.cli", *argv], capture_output=True)
        err = res.stderr.decode()
        assert res.returncode == 2 and err.count("\n") == 1 and "not valid UTF-8 (byte 0xe9" in err, err
    f = tmp_path / "latin1.txt"
    f.write_bytes(bad)
    for argv in (["run", "-m", str(tiny), "-f", str(f)], ["tokenize", "-m", str(tiny), "-f", str(f)],
                 ["perplexity", "-m", str(tiny), "-f", str(f)]):
        res = subprocess.run(MINFER + argv, capture_output=True, text=True)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert str(f) in res.stderr and "not valid UTF-8 (byte 0xe9 at offset 3)" in res.stderr
    res = subprocess.run(MINFER + ["tokenize", "-m", str(tiny), "--stdin"], input=bad, capture_output=True)
    assert res.returncode == 2 and b"standard input: not valid UTF-8" in res.stderr, res.stderr


def test_verbose_shows_the_traceback(tmp_path, capsys):
    missing = str(tmp_path / "nope.gguf")
    assert main(["-v", "tokenize", "-m", missing, "x"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith(f"minfer: error: {missing}")
    assert main(["tokenize", "-v", "-m", missing, "x"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_a_bug_is_one_line_without_verbose(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("boom\nsecond line")
    monkeypatch.setattr(plugins_command, "run", broken)
    assert main(["plugins"]) == 1
    line = one_line(capsys, 1, "internal error: RuntimeError: boom second line", "-v")
    assert line.startswith("minfer: ")
    assert main(["plugins", "-v"]) == 1 and "Traceback" in capsys.readouterr().err


def test_closed_stdout_is_not_an_error(tiny):
    # like `minfer tokenize ... | head -c1`: the reader is gone before minfer writes
    p = subprocess.Popen(MINFER + ["tokenize", "-m", str(tiny), "ab " * 20000], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0 and err == "", err


def test_reader_gone_mid_generation_ends_quietly(tiny, tmp_path):
    # like `minfer run ... | head -c 2`: the reader leaves while tokens stream; the next write ends the
    # command (status 0, nothing on stderr) instead of generating on
    argv = ["--backend", "reference", "run", "-m", str(tiny), "-p", "ab", "-n", "400", "--temp", "0"]
    with open(tmp_path / "err", "w+b") as err:
        p = subprocess.Popen(MINFER + argv, stdout=subprocess.PIPE, stderr=err)
        try:
            assert p.stdout.read(2) == b"ab"
            p.stdout.close()
            status = p.wait(timeout=60)
        finally:
            p.kill()
            p.wait()
        err.seek(0)
        assert status == 0 and err.read() == b"", (status, err)


def _interrupt_after(argv: list[str], marker: str, delay: float, stdin=None) -> subprocess.CompletedProcess:
    """Start minfer with -X importtime (each finished import is a line on stderr), send SIGINT
    ``delay`` seconds after the import of ``marker`` finished, and collect the result."""
    p = subprocess.Popen([sys.executable, "-X", "importtime", *MINFER[1:], *argv], stdin=stdin,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in p.stderr:
        seen.append(line)
        if line.rsplit("|", 1)[-1].strip() == marker:
            break
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    mine = [ln for ln in (seen + err.splitlines(True)) if not ln.startswith("import time:")]
    return subprocess.CompletedProcess(p.args, p.returncode, out, "".join(mine))


@pytest.mark.parametrize("marker,delay", [
    ("minfer_core.errors", 0.0),  # cli.py's own imports (its first lines install the handler)
    ("argparse", 0.05),
    ("torch", 0.0),  # torch's own imports are done, the commands are still importing
    ("minfer_core.tokenizer", 0.5),  # blocked reading stdin
])
def test_ctrl_c_at_any_moment_is_one_line(tiny, marker, delay):
    res = _interrupt_after(["tokenize", "-m", str(tiny), "--stdin"], marker, delay, stdin=subprocess.PIPE)
    assert res.returncode == 130, (res.returncode, res.stderr)
    assert res.stderr.strip() == "minfer: interrupted", res.stderr


def test_tokenize_output_is_still_json(tiny):
    res = subprocess.run(MINFER + ["tokenize", "-m", str(tiny), "the"], capture_output=True, text=True)
    assert res.returncode == 0 and isinstance(json.loads(res.stdout), list)


@pytest.mark.parametrize("sources", [["x", "--stdin"], ["x", "-f", "t.txt"], ["--stdin", "-f", "t.txt"]])
def test_tokenize_takes_one_text_source(capsys, sources):
    # llama-tokenize: --stdin, --file and --prompt are mutually exclusive (and minfer run: -p or -f)
    assert main(["tokenize", "-m", "unused.gguf", *sources]) == 2
    one_line(capsys, 2, "TEXT, -f FILE and --stdin")
