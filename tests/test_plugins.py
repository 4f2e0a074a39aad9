"""Discovery through real entry points, blocking, the allowlist, refusal of bad plugins, tracing,
``minfer plugins``, and the example plugin's kernel against gguf's own dequantizer.

``examples/minfer-example-plugin`` must be pip-installed (``pip install -e``) as the README says.
Broken plugins are installed the same way pip would leave them: a ``*.dist-info`` with an
``entry_points.txt`` on ``sys.path``.
"""

from __future__ import annotations

import itertools
import json
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT, quants as gq

from minfer_core.cli import main
from minfer_core.dispatch import build_plan, make_context
from minfer_core.hookspecs import hookimpl
from minfer_core.plugins import (PluginError, get_plugin_manager, installed_entry_points, known_plugin_names,
                                 plugin_table, plugin_versions)
from minfer_core.policy import load_policy
from minfer_core.weights import Activation, Weight

_ids = itertools.count()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in ("MINFER_LOAD_PLUGINS", "MINFER_TRACE_PLUGINS", "MINFER_POLICY"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="module")
def example_installed():
    if "example" not in installed_entry_points():
        pytest.fail("the example plugin is not installed: pip install -e examples/minfer-example-plugin")


def install_fake(tmp_path, monkeypatch, body: str, name: str = "fake") -> str:
    """Install a plugin module + dist-info (entry point ``name``) on sys.path; returns the module name."""
    mod = f"minfer_fake_plugin_{next(_ids)}"
    (tmp_path / f"{mod}.py").write_text("from minfer_core.hookspecs import hookimpl\n" + textwrap.dedent(body))
    dist = tmp_path / f"{mod}-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[minfer.plugins]\n{name} = {mod}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return mod


# -- discovery --------------------------------------------------------------------------------

def test_reference_is_built_in_and_example_is_discovered(example_installed):
    pm = get_plugin_manager()
    versions = {name: (version, hooks) for name, version, hooks in plugin_versions(pm)}
    assert versions["reference"][0] and "minfer_matmul_candidates" in versions["reference"][1]
    import minfer_example_plugin

    assert versions["example"] == (minfer_example_plugin.__version__,
                                   ["minfer_applicable", "minfer_gates", "minfer_matmul_candidates",
                                    "minfer_register_weight"])
    assert pm.get_plugin("example").__name__ == "minfer_example_plugin.plugin"
    assert "example" in known_plugin_names() and {"mmq_triton", "f16_wmma", "cuda_graphs"} <= known_plugin_names()


def test_fake_entry_point_is_discovered(tmp_path, monkeypatch):
    install_fake(tmp_path, monkeypatch, """
        @hookimpl
        def minfer_applicable(ctx):
            return "never here"
    """)
    pm = get_plugin_manager()
    assert ("fake", "0.3", ["minfer_applicable"]) in plugin_versions(pm)


# -- blocking and the allowlist ---------------------------------------------------------------

def test_block_with_p_no(example_installed, capsys):
    pm = get_plugin_manager(blocked=["example"])
    assert pm.is_blocked("example") and pm.get_plugin("example") is None
    row = next(p for p in plugin_table(pm) if p.name == "example")
    assert row.blocked and row.source.startswith("blocked (-p no:example)")
    assert main(["-p", "no:example", "plugins", "--json"]) == 0
    listed = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["example"]["blocked"] and not listed["reference"]["blocked"]


def test_block_a_project_plugin_that_is_not_installed_is_fine():
    pm = get_plugin_manager(blocked=["cuda_graphs"], allow="")
    assert pm.is_blocked("cuda_graphs")


@pytest.mark.parametrize("blocked,pattern", [
    (["reference"], "the reference backend is built in and cannot be blocked"),
    (["exmaple"], "cannot block 'exmaple': no such plugin"),
])
def test_bad_blocks_are_errors(blocked, pattern):
    with pytest.raises(PluginError, match=pattern):
        get_plugin_manager(blocked=blocked)


def test_cli_bad_block_is_one_line(capsys):
    assert main(["-p", "no:reference", "plugins"]) == 2
    assert capsys.readouterr().err == "minfer: error: the reference backend is built in and cannot be blocked\n"
    assert main(["-p", "example", "plugins"]) == 2
    assert "-p expects no:NAME" in capsys.readouterr().err


def test_allowlist_from_env(example_installed, monkeypatch, tmp_path):
    install_fake(tmp_path, monkeypatch, "\n")
    monkeypatch.setenv("MINFER_LOAD_PLUGINS", "")
    pm = get_plugin_manager()
    assert [n for n, _, _ in plugin_versions(pm)] == ["reference"]  # reference cannot be left out
    monkeypatch.setenv("MINFER_LOAD_PLUGINS", "example, reference")
    pm = get_plugin_manager()
    assert [n for n, _, _ in plugin_versions(pm)] == ["reference", "example"]
    assert pm.is_blocked("fake") and pm.blocked_names["fake"] == "not in MINFER_LOAD_PLUGINS"
    monkeypatch.setenv("MINFER_LOAD_PLUGINS", "nosuch")
    with pytest.raises(PluginError, match="MINFER_LOAD_PLUGINS: plugin 'nosuch' is not installed"):
        get_plugin_manager()
    assert get_plugin_manager(allow=None).get_plugin("fake") is not None  # explicit None: no limit


# -- refusal ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body,pattern", [
    ("""
        @hookimpl
        def minfer_matmul_candidate(weight, phase, ctx):
            return None
     """, "plugin 'fake': unknown hook 'minfer_matmul_candidate' \\(no such hook specification"),
    ("""
        def minfer_matmul_candidates(weight, phase, ctx):
            return None
     """, "plugin 'fake': minfer_matmul_candidates is not marked @hookimpl"),
    ("""
        @hookimpl
        def minfer_matmul_candidates(weight, phase, ctx, dtype):
            return None
     """, "plugin 'fake': .*dtype.*"),
    ("""
        import minfer_no_such_module
     """, r"plugin 'fake' \(minfer_fake_plugin_\d+\) cannot be loaded: ModuleNotFoundError"),
])
def test_bad_plugins_are_refused_by_name(tmp_path, monkeypatch, body, pattern, capsys):
    install_fake(tmp_path, monkeypatch, body)
    with pytest.raises(PluginError, match=pattern) as e:
        get_plugin_manager()
    assert "\n" not in str(e.value)
    assert main(["plugins"]) == 2 and capsys.readouterr().err.startswith("minfer: error: plugin 'fake'")
    assert get_plugin_manager(blocked=["fake"]).is_blocked("fake")  # blocking is the way out


def test_in_process_registration_is_checked_too():
    class Typo:
        @hookimpl
        def minfer_wrap_decode(self, step, ctx):
            return None

    pm = get_plugin_manager(allow="")
    with pytest.raises(PluginError, match="plugin 'typo': unknown hook 'minfer_wrap_decode'"):
        pm.register(Typo(), name="typo")
    assert pm.get_plugin("typo") is None


# -- tracing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["arg", "env", "cli"])
def test_trace_switch(example_installed, how, monkeypatch, capsys):
    if how == "env":
        monkeypatch.setenv("MINFER_TRACE_PLUGINS", "1")
    if how == "cli":
        assert main(["--trace-plugins", "plugins"]) == 0
    else:
        get_plugin_manager(trace=how == "arg")
    err = capsys.readouterr().err
    assert "[minfer plugins] example 0.1.0: loaded from minfer-example-plugin" in err
    monkeypatch.delenv("MINFER_TRACE_PLUGINS", raising=False)
    get_plugin_manager()
    assert capsys.readouterr().err == ""


# -- the example plugin, placed by a policy ---------------------------------------------------

def _q8_0_weight(rows: int, cols: int, seed: int = 0) -> tuple[Weight, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = gq.quantize(values, QT.Q8_0)
    want = gq.dequantize(raw, QT.Q8_0)  # gguf's own dequantizer is the oracle
    return Weight("blk.0.ffn_down", QT.Q8_0, (rows, cols), torch.from_numpy(raw.copy()), "down"), want


def test_example_plugin_placed_by_policy_is_correct(example_installed, tmp_path):
    import yaml

    data = yaml.safe_load(load_policy().path.read_text())
    data["order"]["prefill"] = ["example", "mmq_triton", "f16_wmma"]
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    policy = load_policy(p)
    w, want = _q8_0_weight(48, 96)
    other = Weight("blk.0.attn_output", QT.F32, (8, 32), torch.randn(8, 32).view(torch.uint8).reshape(8, -1), "o")
    pm = get_plugin_manager(allow="example")  # the project's plugins may be installed too
    plan = build_plan([w, other], make_context("cpu", policy, env={}), pm, policy)
    assert plan.prefill[w.name].label == "example.q8_0" and plan.decode[w.name].label == "ref.q8_0"
    assert plan.prefill[other.name].label == "ref.f32"  # the example serves Q8_0 only
    assert "example.q8_0" in w.planes  # built at registration
    x = torch.randn(20, 96)
    y = plan.prefill[w.name].fn(Activation(x))
    torch.testing.assert_close(y, x @ torch.from_numpy(want).T, rtol=1e-5, atol=1e-4)
    # unplaced (shipped policy): installed but never chosen
    default = load_policy()
    plan = build_plan([w], make_context("cpu", default, env={}), pm, default)
    assert plan.prefill[w.name].label == "ref.q8_0"
    assert any("'example'" in n and "does not place" in n for n in plan.notes)
    # --backend example puts it first without touching the policy
    plan = build_plan([w], make_context("cpu", default, env={}), pm, default, backend="example")
    assert plan.prefill[w.name].label == plan.decode[w.name].label == "example.q8_0"


def test_plugins_command_text(example_installed, capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("reference ") and "\nexample 0.1.0  minfer-example-plugin" in out
    assert "  minfer_register_weight" in out


def test_example_plugin_gate_is_declared_placed_and_alive(example_installed, tmp_path, capsys):
    """A third party's own gate: declared by the plugin, listed by ``minfer gates``, its label
    present when on and gone at "0" (environment) or off (policy)."""
    import yaml

    from minfer_core.gates import declared_gates
    from minfer_core.model import Runtime

    pm = get_plugin_manager(allow="example")
    gate = declared_gates(pm)["MINFER_EXAMPLE_Q8"]
    assert gate.plugin == "example" and gate.kind == "switch" and gate.labels == ("example.q8_0",)
    data = yaml.safe_load(load_policy().path.read_text())
    data["order"]["prefill"] = ["example", "mmq_triton", "f16_wmma"]
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(data))
    policy = load_policy(p)
    x = torch.randn(20, 96)

    def labels(env):
        w, _ = _q8_0_weight(48, 96)
        plan = build_plan([w], make_context("cpu", policy, env=env, gates=declared_gates(pm)), pm, policy)
        rt = Runtime(plan, {w.name: w})
        rt.linear(w.name, rt.produce(x))  # a prefill matmul, counted as --trace-dispatch counts it
        return set(rt.counts)

    assert "example.q8_0" in labels({})
    assert "example.q8_0" not in labels({"MINFER_EXAMPLE_Q8": "0"}) and "ref.q8_0" in labels({"MINFER_EXAMPLE_Q8": "0"})
    data["gates"]["example"] = {"MINFER_EXAMPLE_Q8": False}
    p.write_text(yaml.safe_dump(data))
    policy = load_policy(p)
    assert "example.q8_0" not in labels({})
    assert main(["--policy", str(p), "gates", "--json"]) == 0
    g = {x["name"]: x for x in json.loads(capsys.readouterr().out)["gates"]}["MINFER_EXAMPLE_Q8"]
    assert (g["plugin"], g["value"], g["source"]) == ("example", False, "yaml")
