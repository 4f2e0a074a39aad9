"""Gate semantics, the env-over-yaml matrix, and ``minfer gates`` (with and without a model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from gguf import GGMLQuantizationType as QT

from minfer_core.cli import main
from minfer_core.gates import read_gate, resolve_gates
from minfer_core.policy import load_policy
from minfer_mmq_triton.routes import DECODE_SWITCHES, FUSE_GATE, GATES, PLANE_BUILDERS
from test_dispatch import LAYOUT_7B, gate_table, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
ALL_GATES = GATES + PLANE_BUILDERS
SWITCHES = [g for g in ALL_GATES if g != FUSE_GATE]
KNOWN = {"reference", "mmq_triton", "f16_wmma", "cuda_graphs", "example"}
TABLE = gate_table()  # what mmq_triton declares, collected by the core
#: The verified-best values (DESIGN.md): every switch on, fuse mode 2.
BUILTIN_DEFAULTS = {g: True for g in ALL_GATES + DECODE_SWITCHES} | {FUSE_GATE: 2}
SHOWN = set(ALL_GATES + DECODE_SWITCHES + ("MINFER_EXAMPLE_Q8",))  # every installed plugin's gates


def gate_on(name, env):
    """A switch as the core resolves it: the one read function, then the declared semantics."""
    gate = TABLE[name]
    if gate.kind != "switch":
        raise KeyError(f"{name} is a mode")
    return gate.parse(read_gate(name, TABLE, env))


def fuse_mode_requested(env):
    return TABLE[FUSE_GATE].parse(read_gate(FUSE_GATE, TABLE, env))


# -- the one read function and its semantics (DESIGN.md, "The six gates") ---------------------

@pytest.mark.parametrize("raw,on", [(None, True), ("0", False), ("1", True), ("", True), ("off", True),
                                    ("false", True), (" 0", True), ("00", True), ("2", True)])
def test_switch_semantics(raw, on):
    env = {} if raw is None else {"MINFER_MMQ_RAW": raw}
    assert gate_on("MINFER_MMQ_RAW", env) is on


@pytest.mark.parametrize("raw,mode", [(None, 2), ("1", 1), ("2", 2), ("0", 0), ("3", 0), ("", 0), ("yes", 0),
                                      (" 2", 0), ("02", 0)])
def test_fuse_mode_semantics(raw, mode):
    env = {} if raw is None else {FUSE_GATE: raw}
    assert fuse_mode_requested(env) == mode


def test_six_gates_and_two_builders():
    assert [g for g in TABLE if TABLE[g].group == "gate"] == list(GATES)
    assert [g for g in TABLE if TABLE[g].group == "plane_builder"] == list(PLANE_BUILDERS)
    assert {g.plugin for g in TABLE.values()} == {"mmq_triton"} and TABLE[FUSE_GATE].kind == "mode"
    assert GATES == ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE",
                     "MINFER_MMQ_Q6K_NB", "MINFER_MMQ_A_FUSE")
    assert PLANE_BUILDERS == ("MINFER_MMQ_Q6K_EXP", "MINFER_MMQ_Q4K_DSC")
    with pytest.raises(KeyError):
        read_gate("MINFER_MMQ_TYPO", {})
    with pytest.raises(KeyError):
        gate_on(FUSE_GATE, {})


# -- env overrides yaml overrides the built-in default -----------------------------------------

def policy_with_defaults(tmp_path, defaults: dict):
    data = yaml.safe_load((ROOT / "configs" / "gates.yaml").read_text())
    for name, value in defaults.items():
        data["gates"]["mmq_triton"][name] = value
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_policy(p, known_plugins=KNOWN)


@pytest.mark.parametrize("yaml_default", [True, False])
@pytest.mark.parametrize("raw", [None, "0", "1", "", "no"])
def test_switch_override_matrix(tmp_path, yaml_default, raw):
    policy = policy_with_defaults(tmp_path, {g: yaml_default for g in SWITCHES})
    env = {} if raw is None else {g: raw for g in SWITCHES}
    resolved = resolve_gates(policy, TABLE, env)
    for g in SWITCHES:
        v = resolved[g]
        want = yaml_default if raw is None else raw != "0"
        assert v.value is want, (g, raw)
        assert v.source == ("env" if raw is not None else "default" if yaml_default else "yaml")
        assert v.raw == raw
        spec = TABLE[g]
        assert v.effect == (spec.description if want else spec.off)


@pytest.mark.parametrize("yaml_default", [0, 1, 2])
@pytest.mark.parametrize("raw", [None, "0", "1", "2", "x"])
def test_fuse_override_matrix(tmp_path, yaml_default, raw):
    policy = policy_with_defaults(tmp_path, {FUSE_GATE: yaml_default})
    v = resolve_gates(policy, TABLE, {} if raw is None else {FUSE_GATE: raw})[FUSE_GATE]
    want = yaml_default if raw is None else {"1": 1, "2": 2}.get(raw, 0)
    assert v.value == want and v.effect == TABLE[FUSE_GATE].modes[want]
    assert v.source == ("env" if raw is not None else "default" if yaml_default == 2 else "yaml")


def test_builtin_defaults_are_the_shipped_ones():
    policy = load_policy(ROOT / "configs" / "gates.yaml", known_plugins=KNOWN)
    resolved = resolve_gates(policy, TABLE, {})
    assert {g: v.value for g, v in resolved.items()} == BUILTIN_DEFAULTS
    assert {v.source for v in resolved.values()} == {"default"}


def test_only_gates_module_reads_gate_variables():
    """Every gate read goes through minfer_core.gates (seed §3.1: single-sourced)."""
    names = "|".join(SHOWN)
    pattern = re.compile(rf"(environ|getenv)[^\n]*({names})|({names})[^\n]*(environ|getenv)")
    files = [p for d in ("minfer_core", "plugins", "examples") for p in (ROOT / d).rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in files if p.name != "gates.py" and pattern.search(p.read_text())]
    assert not offenders, offenders


# -- minfer gates -------------------------------------------------------------------------------

def gates_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["gates", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_gates_text_shows_value_source_effect(capsys, monkeypatch):
    for g in ALL_GATES:
        monkeypatch.delenv(g, raising=False)
    monkeypatch.setenv("MINFER_MMQ", "0")
    rc, out, _ = gates_cli(capsys)
    assert rc == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("MINFER_")}
    assert set(lines) == SHOWN
    assert re.match(r"MINFER_MMQ\s+off\s+env \('0'\)\s+mmq_triton offers nothing for prefill", lines["MINFER_MMQ"])
    assert re.match(r"MINFER_MMQ_A_FUSE\s+2\s+default\s+fused producers write only", lines[FUSE_GATE])
    assert "prefill      mmq_triton > f16_wmma > reference" in out


def test_gates_json(capsys, monkeypatch):
    for g in ALL_GATES:
        monkeypatch.delenv(g, raising=False)
    monkeypatch.setenv(FUSE_GATE, "1")
    rc, out, _ = gates_cli(capsys, "--json")
    data = json.loads(out)
    g = {x["name"]: x for x in data["gates"]}
    assert g[FUSE_GATE]["value"] == 1 and g[FUSE_GATE]["source"] == "env" and g[FUSE_GATE]["raw"] == "1"
    assert g["MINFER_MMQ_Q6K_EXP"]["group"] == "plane_builder" and g["MINFER_MMQ"]["labels"]
    assert g["MINFER_MMQ"]["kind"] == "switch" and g[FUSE_GATE]["kind"] == "mode"
    assert g["MINFER_MMQ"]["plugin"] == g["MINFER_PDL"]["plugin"] == "mmq_triton"
    assert data["order"]["decode_step"] == data["order"]["batch_step"] == ["cuda_graphs"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the CPU-side view")
def test_gates_model_on_cpu_shows_model_and_hardware(capsys, monkeypatch, qwen_path):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the CPU as a user has it
    for g in ALL_GATES:
        monkeypatch.delenv(g, raising=False)
    rc, out, _ = gates_cli(capsys, "-m", str(qwen_path), "--json")
    m = json.loads(out)["model"]
    assert m["model_fuse_mode"] == 1
    assert re.search(r"degraded to 1: blk\.0\.attn_qk is Q5_0", m["model_fuse_reason"]), m["model_fuse_reason"]
    assert m["fuse_mode"] == 0 and m["fuse_off_reason"].startswith("mmq_triton cannot run here: ")
    assert m["fuse_reason"] == f"fused producers off: {m['fuse_off_reason']}" and m["fuse_plugin"] == "mmq_triton"
    rows = {(r["class"], r["qtype"]): r for r in m["kernels"]["prefill"]}
    assert rows[("output", "q8_0")]["tensors"] == 1 and rows[("down", "q6_k")]["label"]
    assert sum(r["tensors"] for r in m["kernels"]["decode"]) == m["matmul_weights"]
    _, text, _ = gates_cli(capsys, "-m", str(qwen_path))
    assert "the model allows fuse mode 1 (mode 2 degraded to 1: blk.0.attn_qk is Q5_0" in text
    assert "here (cpu): fuse mode 0 (fused producers off: mmq_triton cannot run here: " in text
    assert m["kernels"]["decode_step"] is m["kernels"]["batch_step"] is None  # cuda_graphs needs a GPU
    assert "  decode step: plain (not wrapped)\n" in text and "  batch step: plain (not wrapped)\n" in text
    assert m["kernels"]["batch"] == []  # mmq_triton's rows GEMM needs a GPU: the batched step tiles every weight
    assert "  batch kernels: none (the batched step runs every weight over row tiles)\n" in text
    assert m["kernels"]["decode_groups"] == []  # q|k Q5_0 and v Q8_0: no plugin offers one launch for them


def test_gates_text_lists_decode_groups_under_decode_kernels(capsys, monkeypatch, tmp_path):
    """A group kernel (one launch for weights sharing an input) shows after the decode kernels."""
    from minfer_core.commands.gates import render

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    _, out, _ = gates_cli(capsys, "-m", str(write_tiny_model(tmp_path / "tiny.gguf")), "--json")
    report = json.loads(out)
    report["model"]["kernels"]["decode_groups"] = [
        {"classes": "qk + v", "label": "mmq.gemv_pair.q4_k+q6_k", "plugin": "mmq_triton", "groups": 14}]
    lines = render(report).splitlines()
    at = lines.index("  decode kernels:")
    group = next(i for i, line in enumerate(lines) if "one launch a group" in line)
    assert lines[group].split() == ["qk", "+", "v", "x14", "mmq.gemv_pair.q4_k+q6_k", "(mmq_triton,", "one",
                                    "launch", "a", "group)"]
    assert at < group < lines.index(next(line for line in lines if line.startswith("  producers:")))


def test_gates_model_7b_layout_allows_mode_2(capsys, monkeypatch):
    if not LAYOUT_7B.exists():
        pytest.skip("layout template not here")
    for g in ALL_GATES:
        monkeypatch.delenv(g, raising=False)
    rc, out, _ = gates_cli(capsys, "-m", str(LAYOUT_7B), "--json")
    m = json.loads(out)["model"]
    assert (m["model_fuse_mode"], m["model_fuse_reason"]) == (2, "")
    assert {r["qtype"] for r in m["kernels"]["prefill"]} == {"q4_k", "q6_k"}
    monkeypatch.setenv(FUSE_GATE, "1")
    _, out, _ = gates_cli(capsys, "-m", str(LAYOUT_7B), "--json")
    assert json.loads(out)["model"]["model_fuse_mode"] == 1


@pytest.mark.parametrize("types,mode,named", [
    ({}, 2, None),
    ({"ffn_down": QT.Q5_0}, 1, "blk.0.ffn_down is Q5_0"),
    ({"output": QT.F32}, 1, "output is a 2-D F32 matmul weight"),
])
def test_gates_model_tiny_writer_models(tmp_path, capsys, monkeypatch, types, mode, named):
    for g in ALL_GATES:
        monkeypatch.delenv(g, raising=False)
    path = write_tiny_model(tmp_path / "tiny.gguf", types)
    _, out, _ = gates_cli(capsys, "-m", str(path), "--json")
    m = json.loads(out)["model"]
    assert m["model_fuse_mode"] == mode
    assert (named or "") in m["model_fuse_reason"] and bool(named) == bool(m["model_fuse_reason"])


def test_gates_model_missing_file_is_one_line(tmp_path, capsys):
    rc, out, err = gates_cli(capsys, "-m", str(tmp_path / "nope.gguf"))
    assert rc == 2 and err.count("\n") == 1 and "nope.gguf: file not found" in err
