"""The policy file: the shipped default, selection (--policy / MINFER_POLICY) and every
validation error, each one line ``<file>: <key>: <problem>``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from minfer_core.cli import main
from minfer_core.errors import UserError
from minfer_core.gates import resolve_gates
from minfer_mmq_triton.routes import DECODE_SWITCHES, FUSE_GATE, GATES, PLANE_BUILDERS
from test_dispatch import gate_table
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
    assert list(pol.defaults) == ["mmq_triton"] and list(pol.order) == list(WORK)
    assert set(pol.defaults["mmq_triton"]) == set(GATES + PLANE_BUILDERS + DECODE_SWITCHES)
    assert pol.order["prefill"][0] == "mmq_triton" and pol.order["decode_step"] == ["cuda_graphs"]
    assert pol.order["prefill_step"] == pol.order["batch_step"] == ["cuda_graphs"]
    table = gate_table()
    resolved = resolve_gates(pol, table, {})  # the placements match the declarations
    assert {g: v.source for g, v in resolved.items()} == {g: "default" for g in table}
    assert pol.defaults["mmq_triton"][FUSE_GATE] == 2 and set(table[FUSE_GATE].modes) == {0, 1, 2}


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
    # (change, key in the message, problem pattern): the file's own structure
    ("gates.mmq_trition", {"MINFER_MMQ": True}, "gates.mmq_trition", "unknown plugin 'mmq_trition'"),
    ("gates.mmq_triton.MINFER_MMQ", "maybe", "gates.mmq_triton.MINFER_MMQ", "expected on, off or an integer mode, got 'maybe'"),
    ("gates.mmq_triton.MINFER_MMQ", 1.0, "gates.mmq_triton.MINFER_MMQ", "expected on, off or an integer mode, got 1.0"),
    ("gates.mmq_triton.minfer_mmq", True, "gates.mmq_triton.minfer_mmq", "expected a gate name MINFER_"),
    ("gates.mmq_triton", ["MINFER_MMQ"], "gates.mmq_triton", "expected a mapping, got list"),
    ("order.prefill", ["mmq_triton", "nosuch"], "order.prefill", "unknown plugin 'nosuch'"),
    ("order.decode", ["f16_wmma", "f16_wmma"], "order.decode", "plugin 'f16_wmma' is listed twice"),
    ("order.attention", DELETE, "order.attention", "missing"),
    ("order.batch_step", ["cuda_graphs", "nosuch"], "order.batch_step", "unknown plugin 'nosuch'"),
    ("order.batch_step", "cuda_graphs", "order.batch_step", "expected a list of plugin names"),
    ("order.everything", ["reference"], "order.everything", "unknown key"),
    ("order", ["mmq_triton"], "order", "expected a mapping, got list"),
    ("version", 2, "version", "unsupported version 2"),
    ("extra", 1, "extra", "unknown key"),
    ("order", DELETE, "order", "missing"),
]

#: Placements checked against what mmq_triton declares, when the gates are resolved.
PLACEMENT_CASES = [
    ("gates.mmq_triton.MINFER_MMQ_FOO", True, "gates.mmq_triton.MINFER_MMQ_FOO", "unknown gate (mmq_triton declares: "),
    ("gates.f16_wmma.MINFER_MMQ_RAW", False, "gates.f16_wmma.MINFER_MMQ_RAW", "belongs under gates.mmq_triton"),
    ("gates.mmq_triton.MINFER_MMQ", 1, "gates.mmq_triton.MINFER_MMQ", "expected on or off, got 1"),
    ("gates.mmq_triton.MINFER_MMQ", 0, "gates.mmq_triton.MINFER_MMQ", "expected on or off, got 0"),
    ("gates.mmq_triton.MINFER_MMQ_A_FUSE", 3, "gates.mmq_triton.MINFER_MMQ_A_FUSE", "expected a mode 0, 1 or 2, got 3"),
    ("gates.mmq_triton.MINFER_MMQ_A_FUSE", True, "gates.mmq_triton.MINFER_MMQ_A_FUSE", "expected a mode 0, 1 or 2"),
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


@pytest.mark.parametrize("dotted,value,key,problem", PLACEMENT_CASES, ids=[c[0] for c in PLACEMENT_CASES])
def test_placement_errors(tmp_path, data, dotted, value, key, problem):
    bad = copy.deepcopy(data)
    bad["gates"].setdefault(dotted.split(".")[1], {})
    _set(bad, dotted, value)
    path = write(tmp_path, bad)
    policy = load_policy(path, known_plugins=KNOWN)
    with pytest.raises(PolicyError) as e:
        resolve_gates(policy, gate_table(), {}, loaded={"mmq_triton", "f16_wmma"})
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}: ") and problem in msg and "\n" not in msg, msg


def test_optional_step_orders_may_be_left_out(tmp_path, data):
    """A policy written before ``prefill_step`` / ``batch_step`` existed still loads: nobody wraps them."""
    mine = copy.deepcopy(data)
    del mine["order"]["prefill_step"], mine["order"]["batch_step"]
    pol = load_policy(write(tmp_path, mine), known_plugins=KNOWN)
    assert pol.order["prefill_step"] == pol.order["batch_step"] == [] and pol.order["decode_step"] == ["cuda_graphs"]


def test_placement_of_a_plugin_not_loaded_is_not_in_force(tmp_path, data):
    mine = copy.deepcopy(data)
    mine["gates"]["cuda_graphs"] = {"MINFER_GRAPHS_ANYTHING": False}
    policy = load_policy(write(tmp_path, mine), known_plugins=KNOWN)
    assert "MINFER_GRAPHS_ANYTHING" not in resolve_gates(policy, gate_table(), {})


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
    bad["gates"]["mmq_triton"]["MINFER_MMQ_RAW"] = "sometimes"
    path = write(tmp_path, bad)
    assert main(["--policy", str(path), "gates"]) == 2
    err = capsys.readouterr().err
    assert err == (f"minfer: error: {path}: gates.mmq_triton.MINFER_MMQ_RAW: expected on, off or an integer mode, "
                   "got 'sometimes'\n")
    monkeypatch.setenv("MINFER_POLICY", str(path))
    assert main(["gates"]) == 2 and "gates.mmq_triton.MINFER_MMQ_RAW" in capsys.readouterr().err
    bad["gates"]["mmq_triton"]["MINFER_MMQ_RAW"] = 1  # a placement the declaration refuses: the same line
    path = write(tmp_path, bad, "p2.yaml")
    assert main(["--policy", str(path), "gates"]) == 2
    assert capsys.readouterr().err == f"minfer: error: {path}: gates.mmq_triton.MINFER_MMQ_RAW: expected on or off, got 1\n"


def test_packaged_copy_matches_the_shipped_file():
    """A wheel carries the policy as minfer_core/gates.yaml (package data); it must not drift."""
    copy_ = ROOT / "minfer_core" / "gates.yaml"
    if not copy_.exists():
        pytest.skip("no packaged copy in this checkout (configs/gates.yaml is used)")
    assert copy_.read_bytes() == DEFAULT.read_bytes()
