"""Sampling defaults from the model file (``general.sampling.*``), as llama.cpp reads them: a flag (or
a request's field, in the server) wins, then the file's value, then the built-in default; a value out
of range is ignored with a line on stderr."""

from __future__ import annotations

import argparse

import pytest

from minfer_core.commands.common import add_sampling_args, sampler_config
from minfer_core.sampling import SamplerConfig, file_defaults

from test_cli import minfer
from test_config import build


def flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_sampling_args(p)
    return p.parse_args(list(argv))


def test_the_files_values_are_read_and_bad_ones_refused():
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 2.0,
          "general.sampling.min_p": "0.1", "general.sampling.penalty_last_n": True,
          "general.sampling.penalty_repeat": 1.1, "general.name": "x"}
    found, refused = file_defaults(md)
    assert found == {"temp": 0.6, "top_k": 20, "repeat_penalty": 1.1}
    assert [r.split(" = ")[0] for r in refused] == ["general.sampling.top_p", "general.sampling.min_p",
                                                     "general.sampling.penalty_last_n"]
    assert file_defaults({"general.sampling.top_k": 4.0})[0] == {}  # top_k is an integer


def test_a_flag_wins_then_the_file_then_the_default():
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20}
    cfg = sampler_config(flags("--temp", "0.3"), md)
    built_in = SamplerConfig()
    assert (cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p) == (0.3, 20, built_in.top_p, built_in.min_p)
    assert sampler_config(flags(), {}) == SamplerConfig(seed=-1)


def test_run_takes_the_files_temperature(tmp_path, capfd):
    """A file that says temp 0 decodes greedily whatever the seed: the same text as --temp 0 given."""
    def edit(md, ts):
        md["general.sampling.temp"] = 0.0
        md["general.sampling.top_p"] = 7.5  # out of range: ignored, said on stderr

    path = str(build(tmp_path, edit=edit))
    runs = [minfer("--backend", "reference", "run", "-m", path, "-p", "ab", "-n", "8", "-s", s) for s in ("1", "2")]
    given = minfer("--backend", "reference", "run", "-m", path, "-p", "ab", "-n", "8", "-s", "3", "--temp", "0")
    for r in (*runs, given):
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout == runs[1].stdout == given.stdout
    assert "general.sampling.top_p = 7.5 ignored" in runs[0].stderr



def test_a_request_field_wins_then_the_file_then_openais_default():
    from minfer_core.server.protocol import CompletionRequest

    d = {"temp": 0.3, "top_k": 1, "min_p": 0.2}
    cfg = CompletionRequest(prompt="x", top_k=5, top_p=None).sampler(d)  # null: the default
    assert (cfg.temp, cfg.top_k, cfg.top_p, cfg.min_p) == (0.3, 5, 1.0, 0.2)
    plain = CompletionRequest(prompt="x").sampler({})
    assert (plain.temp, plain.top_k, plain.top_p, plain.min_p) == (1.0, 0, 1.0, 0.0)  # OpenAI's defaults


@pytest.mark.parametrize("file, flags", [({"general.sampling.top_k": 1}, None),  # the file's top_k 1
                                         ({"general.sampling.temp": 1.5}, {"temp": 0.0})])  # serve --temp 0 wins
def test_serve_takes_its_flags_then_the_files_defaults(tmp_path, file, flags):
    """Requests that leave the sampling fields out draw the best token whatever the seed when the
    server's defaults make them greedy: the same text as an explicit temperature 0."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from minfer_core.batch_engine import BatchEngine
    from serve_helpers import live_server

    path = build(tmp_path, edit=lambda md, ts: md.update(file))
    engine = BatchEngine.load(path, n_ctx=64, parallel=2, max_queue=4, device="cpu", backend="reference",
                              progress=False)
    with live_server(engine, template=None, sampling_defaults=flags) as (base, _):
        def complete(**kw):
            r = httpx.post(base + "/v1/completions", timeout=60,
                           json={"prompt": [1, 2, 3], "max_tokens": 8, "ignore_eos": True, **kw})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        texts = {complete(seed=s, **({} if flags else {"temperature": 1.5})) for s in (1, 2, 3)}
        assert texts == {complete(temperature=0)}


def test_serve_help_lists_the_request_defaults():
    res = minfer("serve", "--help")
    assert res.returncode == 0 and "--repeat-last-n" in res.stdout and "general.sampling" in res.stdout
    bad = minfer("serve", "-m", "absent.gguf", "--temp", "-1")
    assert bad.returncode == 2 and "--temp" in bad.stderr
