"""``minfer bench -d``: tests run after a depth of cached tokens, labelled as llama-bench labels them."""

from __future__ import annotations

import json

import pytest

from minfer_core.cli import main
from minfer_core.throughput import time_gen, time_prompt
from minfer_core.engine import Engine
from test_cli import minfer
from test_config import build


def test_depth_fills_the_cache_before_the_timed_tokens(tmp_path):
    eng = Engine.load(build(tmp_path), backend="reference", device="cpu", n_ctx=128, progress=False)
    time_gen(eng, 5, depth=40)
    assert len(eng.cached) == 45
    time_prompt(eng, 20, depth=40)
    assert len(eng.cached) == 60 and eng.last_prefill == 20  # the depth came from the cache
    time_gen(eng, 5)
    assert len(eng.cached) == 5


def test_bench_depth_rows(tmp_path):
    model = str(build(tmp_path))
    res = minfer("--backend", "reference", "bench", "-m", model, "-p", "16", "-n", "4",
                 "-d", "0,24", "-r", "1", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert [r["test"] for r in json.loads(res.stdout)] == ["pp16", "pp16 @ d24", "tg4", "tg4 @ d24"]
    bad = minfer("bench", "-m", model, "-d", "-5")
    assert bad.returncode == 2 and "-d" in bad.stderr


@pytest.mark.parametrize("argv,need", [
    (["-p", "8", "-n", "0", "-d", "600"], "608"),  # llama-bench's context: depth + the test's tokens
    (["-p", "600", "-n", "4"], "600"),
    (["-p", "500", "-n", "100", "--batch", "1"], None),
    (["-p", "8", "-n", "8", "-d", "600", "--batch", "1"], None),  # --batch has no depth: not silently dropped
])
def test_lengths_beyond_the_model_context_are_refused(tmp_path, capsys, argv, need):
    # as an explicit -c over the model's context is: one line, status 2 (the tiny model has 512 tokens)
    model = str(build(tmp_path))
    assert main(["--backend", "reference", "bench", "-m", model, "-r", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: ") and err.count("\n") == 1, err
    assert ("-d" in err) if "-d" in argv and "--batch" in argv else ("512" in err), err
    assert need is None or f"{need} tokens" in err


def test_lengths_filling_the_model_context_run(tmp_path):
    res = minfer("--backend", "reference", "bench", "-m", str(build(tmp_path)), "-p", "0", "-n", "256",
                 "-d", "256", "-r", "1", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert [r["test"] for r in json.loads(res.stdout)] == ["tg256 @ d256"]
