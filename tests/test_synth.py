"""The synthesizer: files that open, match their template's layout, and hold well-scaled values.

Values are checked through gguf's own ``gguf.quants.dequantize`` (not our dequantizer).
"""

from __future__ import annotations

import argparse
import lzma
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT, quants as gq

from minfer_core.commands import synth as synth_cmd
from minfer_core.model_config import config_from_gguf
from minfer_core.dequant import dequantize
from minfer_core.gguf_file import ModelFileError, open_gguf
from minfer_core.quants import SUPPORTED
from minfer_core.synth import read_template, synthesize, tiny_layout, write_layout

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_NAME = "qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz"
TEMPLATE_05B = next((p for p in (ROOT / "models" / TEMPLATE_NAME, ROOT / ".carry" / TEMPLATE_NAME,
                                 ROOT.parent / "shared/models" / TEMPLATE_NAME) if p.exists()), None)


def check_values(name: str, qtype: QT, rows: np.ndarray) -> None:
    x = gq.dequantize(rows, qtype).astype(np.float64)
    assert np.isfinite(x).all(), name
    if name.endswith("norm.weight"):
        assert (x == 1.0).all(), name
    elif name.endswith(".bias"):
        assert 0.005 < x.std() < 0.02 and abs(x.mean()) < 0.005, (name, x.mean(), x.std())
    else:
        assert 0.015 < x.std() < 0.03 and abs(x.mean()) < 0.003, (name, x.mean(), x.std())


def tiny(tmp_path, qtype=QT.Q4_K, arch="qwen2") -> Path:
    layout = tmp_path / f"tiny-{arch}-{qtype.name}.layout.gguf"
    write_layout(layout, *tiny_layout(arch, qtype))
    return layout


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_every_type(tmp_path, qtype):
    out = tmp_path / "m.gguf"
    synthesize(tiny(tmp_path, qtype), out, seed=1, progress=False)
    f = open_gguf(out)
    cfg = config_from_gguf(f)
    assert cfg.n_layers == 2 and cfg.vocab_size == 260
    for e in f.tensors.values():
        check_values(e.name, e.qtype, e.data)
        if e.data.ndim == 2:  # our dequantizer agrees with gguf's on these blocks too
            ours = dequantize(torch.from_numpy(e.data), e.qtype, e.shape[-1]).numpy()
            assert np.array_equal(ours, gq.dequantize(e.data, e.qtype)), e.name


def test_deterministic_and_header_kept(tmp_path):
    layout = tiny(tmp_path, QT.Q6_K, "llama")
    xz = tmp_path / "t.layout.gguf.xz"
    xz.write_bytes(lzma.compress(layout.read_bytes()))
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    synthesize(layout, a, seed=3, progress=False)
    synthesize(xz, b, seed=3, progress=False)
    synthesize(layout, c, seed=4, progress=False)
    assert a.read_bytes() == b.read_bytes()
    _, h = read_template(layout)
    head = layout.read_bytes()[:h.header_end]
    assert a.read_bytes()[:h.header_end] == head == c.read_bytes()[:h.header_end]
    assert a.read_bytes() != c.read_bytes()
    assert not list(tmp_path.glob("*.part"))


def test_bad_template(tmp_path):
    bad = tmp_path / "bad.layout.gguf.xz"
    bad.write_bytes(lzma.compress(b"not a gguf header at all"))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        synthesize(bad, tmp_path / "o.gguf", progress=False)
    with pytest.raises(ModelFileError, match="file not found"):
        synthesize(tmp_path / "missing.xz", tmp_path / "o.gguf", progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_real_template_05b(tmp_path, qwen_path):
    """Full size from the shipped template: same bytes before the data as the real file, same
    size, same config; sampled rows of every tensor are well scaled."""
    if TEMPLATE_05B is None:
        pytest.skip(f"layout template {TEMPLATE_NAME} not found under models/")
    out = tmp_path / "synth-0.5b.gguf"
    synthesize(TEMPLATE_05B, out, seed=0, progress=False)
    f, real = open_gguf(out), open_gguf(qwen_path)
    assert out.stat().st_size == qwen_path.stat().st_size
    n = f.header.data_offset
    with open(out, "rb") as a, open(qwen_path, "rb") as b:
        assert a.read(n) == b.read(n)
    assert config_from_gguf(f) == config_from_gguf(real)
    assert [(e.name, e.qtype, e.shape) for e in f.tensors.values()] == \
           [(e.name, e.qtype, e.shape) for e in real.tensors.values()]
    for e in f.tensors.values():
        check_values(e.name, e.qtype, e.data if e.data.ndim == 1 else e.data[:: max(1, len(e.data) // 64)])


def test_command(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="minfer")
    synth_cmd.add_parser(parser.add_subparsers())
    out, layout = tmp_path / "cmd.gguf", tiny(tmp_path)
    args = parser.parse_args(["synth", str(layout), str(out), "--seed", "5"])
    assert (args.template, args.out, args.seed) == (layout, out, 5)
    assert synth_cmd.run(args) == 0
    assert out.exists() and "synth: wrote" in capsys.readouterr().err
    bad = parser.parse_args(["synth", str(tmp_path / "nope.xz"), str(out)])
    with pytest.raises(ModelFileError, match="nope.xz: file not found"):
        synth_cmd.run(bad)


def test_a_template_larger_than_the_free_disk_is_refused(tmp_path, monkeypatch):
    """``minfer synth`` checks the size the tensor table claims against the free space first."""
    import shutil
    from collections import namedtuple

    from minfer_core.errors import UserError
    from minfer_core.synth import synthesize

    layout = Path(__file__).resolve().parents[1] / "models" / "qwen2.5-coder-0.5b-q4_k_m.layout.gguf.xz"
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(UserError, match="free"):
        synthesize(layout, tmp_path / "big.gguf", progress=False)
    assert not list(tmp_path.iterdir())
