"""``minfer bench -d``: tests run after a depth of cached tokens, labelled as llama-bench labels them."""

from __future__ import annotations

import json

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
