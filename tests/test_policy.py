"""The policy file: the shipped default, selection (--policy / MINFER_POLICY) and every
validation error, each one line ``<file>: <key>: <problem>``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from minfer_core.cli import main
from minfer_core.errors import UserError
from minfer_core.gates import ALL_GATES, FUSE_GATE
from minfer_core.plugins import installed_entry_points
from minfer_core.policy import WORK, PolicyError, load_policy

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "configs" / "gates.yaml"
KNOWN = {"reference", "mmq_triton", "f16_wmma", "cuda_graphs"}


@pytest.fixture(scope="module")
def data():
    return yaml.safe_load(DEFAULT.read_text())


def write(tmp_path, data, name="policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return p


def test_shipped_default(data):
    pol = load_policy(DEFAULT, known_plugins=KNOWN)
    assert set(pol.gates) == set(ALL_GATES) and list(pol.order) == list(WORK)
    assert pol.order["prefill"][0] == "mmq_triton" and pol.order["decode_step"] == ["cuda_graphs"]
    for name, spec in pol.gates.items():
        assert spec.description and spec.labels and spec.enables == ["mmq_triton"], name
        assert spec.kind == ("builder" if name in ("MINFER_MMQ_Q6K_EXP", "MINFER_MMQ_Q4K_DSC") else "gate")
    assert set(pol.gates[FUSE_GATE].modes) == {0, 1, 2}


def test_default_found_without_arguments(monkeypatch):
    monkeypatch.delenv("MINFER_POLICY", raising=False)
    assert load_policy(known_plugins=KNOWN).path.resolve() == DEFAULT.resolve()


def test_env_and_explicit_path_select_the_file(tmp_path, data, monkeypatch):
    mine = copy.deepcopy(data)
    mine["order"]["prefill"] = ["f16_wmma", "mmq_triton"]
    env_file, arg_file = write(tmp_path, mine, "env.yaml"), write(tmp_path, data, "arg.yaml")
    monkeypatch.setenv("MINFER_POLICY", str(env_file))
    assert load_policy(known_plugins=KNOWN).order["prefill"] == ["f16_wmma", "mmq_triton"]
    assert load_policy(arg_file, known_plugins=KNOWN).path == arg_file  # --policy beats the env


def test_installed_entry_point_may_be_placed(tmp_path, data):
    if "example" not in installed_entry_points():
        pytest.fail("pip install -e examples/minfer-example-plugin (the README's install step)")
    mine = copy.deepcopy(data)
    mine["order"]["prefill"] = ["example", "mmq_triton"]
    assert load_policy(write(tmp_path, mine)).order["prefill"][0] == "example"


def _set(d: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for k in path:
        d = d[k]
    last = int(last) if last.isdigit() else last
    if value is DELETE:
        del d[last]
    else:
        d[last] = value


DELETE = object()

CASES = [
    # (change, key in the message, problem pattern)
    ("gates.MINFER_MMQ_FOO", {"default": True}, "gates.MINFER_MMQ_FOO", "unknown gate"),
    ("gates.MINFER_MMQ_Q6K_EXP", {"default": True}, "gates.MINFER_MMQ_Q6K_EXP", "belongs under plane_builders"),
    ("gates.MINFER_MMQ_RAW", DELETE, "gates.MINFER_MMQ_RAW", "missing"),
    ("plane_builders.MINFER_MMQ_Q4K_DSC", DELETE, "plane_builders.MINFER_MMQ_Q4K_DSC", "missing"),
    ("gates.MINFER_MMQ.default", "maybe", "gates.MINFER_MMQ.default", "expected on or off, got 'maybe'"),
    ("gates.MINFER_MMQ.default", 1, "gates.MINFER_MMQ.default", "expected on or off, got 1"),
    ("gates.MINFER_MMQ.default", "0", "gates.MINFER_MMQ.default", "expected on or off, got '0'"),
    ("gates.MINFER_MMQ_A_FUSE.default", 3, "gates.MINFER_MMQ_A_FUSE.default", "expected a fuse mode 0, 1 or 2, got 3"),
    ("gates.MINFER_MMQ_A_FUSE.default", True, "gates.MINFER_MMQ_A_FUSE.default", "expected a fuse mode"),
    ("gates.MINFER_MMQ_A_FUSE.default", "2", "gates.MINFER_MMQ_A_FUSE.default", "expected a fuse mode"),
    ("gates.MINFER_MMQ_A_FUSE.modes.1", DELETE, "gates.MINFER_MMQ_A_FUSE.modes.1", "missing"),
    ("gates.MINFER_MMQ.defualt", True, "gates.MINFER_MMQ.defualt", "unknown key"),
    ("gates.MINFER_MMQ.description", DELETE, "gates.MINFER_MMQ.description", "missing"),
    ("gates.MINFER_MMQ.description", "", "gates.MINFER_MMQ.description", "expected a non-empty string"),
    ("gates.MINFER_MMQ.labels", [], "gates.MINFER_MMQ.labels", "at least one label prefix"),
    ("gates.MINFER_MMQ.enables", ["mmq_trition"], "gates.MINFER_MMQ.enables", "unknown plugin 'mmq_trition'"),
    ("gates.MINFER_MMQ.enables", "mmq_triton", "gates.MINFER_MMQ.enables", "expected a list of plugin names"),
    ("order.prefill", ["mmq_triton", "nosuch"], "order.prefill", "unknown plugin 'nosuch'"),
    ("order.decode", ["f16_wmma", "f16_wmma"], "order.decode", "plugin 'f16_wmma' is listed twice"),
    ("order.attention", DELETE, "order.attention", "missing"),
    ("order.everything", ["reference"], "order.everything", "unknown key"),
    ("order", ["mmq_triton"], "order", "expected a mapping, got list"),
    ("version", 2, "version", "unsupported version 2"),
    ("extra", 1, "extra", "unknown key"),
    ("gates", DELETE, "gates", "missing"),
]


@pytest.mark.parametrize("dotted,value,key,problem", CASES, ids=[c[0] + ("-del" if c[1] is DELETE else "") for c in CASES])
def test_validation_errors(tmp_path, data, dotted, value, key, problem):
    bad = copy.deepcopy(data)
    _set(bad, dotted, value)
    path = write(tmp_path, bad)
    with pytest.raises(PolicyError) as e:
        load_policy(path, known_plugins=KNOWN)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}: "), msg
    assert problem in msg and "\n" not in msg
    assert isinstance(e.value, UserError)


@pytest.mark.parametrize("text,key,problem", [
    ("version: 1\ngates: [\n", "line 3", "not valid YAML"),
    ("", "file", "empty policy"),
    ("- just\n- a list\n", "file", "expected a mapping, got list"),
])
def test_file_level_errors(tmp_path, text, key, problem):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        load_policy(path, known_plugins=KNOWN)
    assert str(e.value).startswith(f"{path}: {key}: ") and problem in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(PolicyError, match=r"nope\.yaml: file: cannot read: No such file"):
        load_policy(tmp_path / "nope.yaml", known_plugins=KNOWN)


def test_cli_bad_policy_is_one_line_exit_2(tmp_path, data, capsys, monkeypatch):
    bad = copy.deepcopy(data)
    bad["gates"]["MINFER_MMQ_RAW"]["default"] = "sometimes"
    path = write(tmp_path, bad)
    assert main(["--policy", str(path), "gates"]) == 2
    err = capsys.readouterr().err
    assert err == f"minfer: error: {path}: gates.MINFER_MMQ_RAW.default: expected on or off, got 'sometimes'\n"
    monkeypatch.setenv("MINFER_POLICY", str(path))
    assert main(["gates"]) == 2 and "gates.MINFER_MMQ_RAW.default" in capsys.readouterr().err


def test_packaged_copy_matches_the_shipped_file():
    """A wheel carries the policy as minfer_core/gates.yaml (package data); it must not drift."""
    copy_ = ROOT / "minfer_core" / "gates.yaml"
    if not copy_.exists():
        pytest.skip("no packaged copy in this checkout (configs/gates.yaml is used)")
    assert copy_.read_bytes() == DEFAULT.read_bytes()
