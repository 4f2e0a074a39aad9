"""Sampling defaults from the model file (``general.sampling.*``), as llama.cpp reads them: a flag the
user gives wins, then the file's value, then the built-in default; a value out of range is ignored
with a line on stderr."""

from __future__ import annotations

import argparse

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

