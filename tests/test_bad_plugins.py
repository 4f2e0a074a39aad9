"""Misbehaving plugins (issue #14): every failure names the plugin and the hook, a hook that
raises costs that plugin the decision (not the run), a hook that returns the wrong thing is an
error, and nothing displaces or blocks the built-in reference backend.

The bad plugins are plain classes registered in the test (``manager``) or installed as entry
points the way pip leaves them (``install_fake``).
"""

from __future__ import annotations

import pytest
import torch

from minfer_core.cli import main
from minfer_core.dispatch import BackendError, build_plan, make_context, wrap_step
from minfer_core.hookspecs import hookimpl
from minfer_core.plugins import PluginError, get_plugin_manager, plugin_versions
from minfer_core.weights import Candidate
from test_dispatch import (F16StandIn, _ref_fn, all_standins, gpu_ctx, loaded_weights, manager, policy,  # noqa: F401
                           plane_model, table_weights, with_order)
from test_plugins import _clean_env, install_fake  # noqa: F401


class Raiser(F16StandIn):
    """A placed plugin (named like the project's f16_wmma) whose chosen hook raises."""

    def __init__(self, hook: str):
        self.hook = hook

    @hookimpl
    def minfer_matmul_candidates(self, weight, phase, ctx):
        if self.hook == "minfer_matmul_candidates":
            raise ValueError("bad shape table")
        return [Candidate(self.NAME, "f16.gemm", _ref_fn(weight))]

    @hookimpl
    def minfer_register_weight(self, weight, ctx):
        if self.hook == "minfer_register_weight":
            raise RuntimeError("out of plane memory")

    @hookimpl
    def minfer_applicable(self, ctx):
        if self.hook == "minfer_applicable":
            raise ImportError("no module named 'cublas_ext'")
        return None


def first_f16(policy, tmp_path):
    return with_order(policy, tmp_path, prefill=["f16_wmma", "mmq_triton"], decode=["f16_wmma", "mmq_triton"])


# -- a hook that raises: out of that decision, named, with a warning -----------------------------

def test_raising_candidates_hook_falls_through_with_a_warning(policy, plane_model, tmp_path, capsys):
    pol = first_f16(policy, tmp_path)
    plan = build_plan(table_weights(plane_model), gpu_ctx(pol), manager(Raiser("minfer_matmul_candidates")), pol,
                      register=False)
    assert {c.plugin for c in plan.prefill.values()} == {"reference"}  # the next in line serves
    err = capsys.readouterr().err
    want = ("minfer: warning: plugin 'f16_wmma' hook minfer_matmul_candidates raised ValueError: bad shape table; "
            "block it with -p no:f16_wmma (left out of this decision)\n")
    assert err == want  # once, not once per weight
    assert any("plugin 'f16_wmma' hook minfer_matmul_candidates raised" in n for n in plan.notes)


def test_raising_plugin_the_policy_never_places_does_not_break_the_run(policy, plane_model, capsys):
    class Unplaced(Raiser):
        NAME = "thirdparty"

    plan = build_plan(table_weights(plane_model), gpu_ctx(policy), manager(*all_standins(), Unplaced(
        "minfer_matmul_candidates")), policy, register=False)
    assert {c.plugin for c in plan.prefill.values()} == {"mmq_triton"}
    assert "plugin 'thirdparty' hook minfer_matmul_candidates raised ValueError" in capsys.readouterr().err


def test_raising_register_weight_leaves_the_plugin_out_of_the_load(policy, plane_model, tmp_path, capsys):
    pol = first_f16(policy, tmp_path)
    plan = build_plan(loaded_weights(plane_model), gpu_ctx(pol), manager(Raiser("minfer_register_weight")), pol)
    assert {c.plugin for c in plan.prefill.values()} == {"reference"}
    assert plan.applicable["f16_wmma"] == "its minfer_register_weight raised (see the warning)"
    assert "plugin 'f16_wmma' hook minfer_register_weight raised RuntimeError: out of plane memory" \
        in capsys.readouterr().err


def test_raising_applicable_means_not_applicable(policy, plane_model, tmp_path, capsys):
    pol = first_f16(policy, tmp_path)
    plan = build_plan(table_weights(plane_model), gpu_ctx(pol), manager(Raiser("minfer_applicable")), pol,
                      register=False)
    assert plan.applicable["f16_wmma"] == "its minfer_applicable raised (see the warning)"
    assert {c.plugin for c in plan.prefill.values()} == {"reference"}
    assert "hook minfer_applicable raised ImportError: no module named 'cublas_ext'" in capsys.readouterr().err


@pytest.mark.parametrize("hook", ["minfer_matmul_candidates", "minfer_applicable", "minfer_register_weight"])
def test_raising_hook_of_the_explicit_backend_is_an_error(policy, plane_model, hook):
    with pytest.raises(PluginError) as e:
        build_plan(loaded_weights(plane_model), gpu_ctx(policy), manager(Raiser(hook)), policy, backend="f16_wmma")
    msg = str(e.value)
    assert msg.startswith(f"plugin 'f16_wmma' hook {hook} raised ") and msg.endswith("; block it with -p no:f16_wmma")
    assert "\n" not in msg


# -- a hook that returns the wrong thing: an error naming plugin and hook ----------------------------

@pytest.mark.parametrize("answer", [False, True, 0, "", ["no"]])
def test_applicable_must_return_none_or_a_reason(policy, plane_model, answer):
    class Odd(F16StandIn):
        @hookimpl
        def minfer_applicable(self, ctx):
            return answer

    with pytest.raises(PluginError) as e:
        build_plan(table_weights(plane_model), gpu_ctx(policy), manager(Odd()), policy, register=False)
    assert str(e.value).startswith(f"plugin 'f16_wmma' hook minfer_applicable returned {answer!r}"[:60])
    assert "expected None (it can run here) or a reason string; block it with -p no:f16_wmma" in str(e.value)
    assert "cannot run here: False" not in str(e.value)


def test_candidate_without_a_callable_is_named(policy, plane_model, tmp_path):
    class NoFn(F16StandIn):
        @hookimpl
        def minfer_matmul_candidates(self, weight, phase, ctx):
            return [Candidate(self.NAME, "f16.gemm", None)]

    with pytest.raises(PluginError) as e:
        build_plan(table_weights(plane_model), gpu_ctx(policy), manager(NoFn()), policy, register=False)
    msg = str(e.value)
    assert msg.startswith("plugin 'f16_wmma' hook minfer_matmul_candidates returned a Candidate for prefill ")
    assert "with fn=None: expected Candidates with a callable fn and a non-empty label" in msg


def test_wrapper_returning_a_non_callable_is_named(policy, plane_model):
    class BadGraphs:
        NAME = "cuda_graphs"

        @hookimpl
        def minfer_wrap_decode_step(self, step, ctx):
            return 42

    pm = manager(BadGraphs())
    ctx = gpu_ctx(policy)
    plan = build_plan(table_weights(plane_model), ctx, pm, policy, register=False)
    with pytest.raises(PluginError, match=r"^plugin 'cuda_graphs' hook minfer_wrap_decode_step returned 42: "
                                          r"expected a callable"):
        wrap_step("decode_step", lambda t, p: t, ctx, pm, plan)


def test_batch_step_wrapper_returning_a_non_callable_is_named(policy, plane_model):
    class BadGraphs:
        NAME = "cuda_graphs"

        @hookimpl
        def minfer_wrap_batch_step(self, step, padding, ctx):
            return "graph"

    pm = manager(BadGraphs())
    ctx = gpu_ctx(policy)
    plan = build_plan(table_weights(plane_model), ctx, pm, policy, register=False)
    assert plan.batch_step_order == ["cuda_graphs"] and plan.decode_step_order == []
    with pytest.raises(PluginError, match=r"^plugin 'cuda_graphs' hook minfer_wrap_batch_step returned 'graph': "
                                          r"expected a callable"):
        wrap_step("batch_step", lambda inputs: inputs, ctx, pm, plan, padding=torch.zeros(4, dtype=torch.long))


def test_wrapper_that_raises_leaves_the_step_plain(policy, plane_model, capsys):
    class Crashing:
        NAME = "cuda_graphs"

        @hookimpl
        def minfer_wrap_decode_step(self, step, ctx):
            raise RuntimeError("capture failed")

    pm = manager(Crashing())
    ctx = gpu_ctx(policy)
    plan = build_plan(table_weights(plane_model), ctx, pm, policy, register=False)
    assert plan.decode_step_order == ["cuda_graphs"]
    assert wrap_step("decode_step", lambda t, p: t, ctx, pm, plan) is None  # the engine keeps the plain step
    assert "plugin 'cuda_graphs' hook minfer_wrap_decode_step raised RuntimeError: capture failed" \
        in capsys.readouterr().err


# -- the reference backend cannot be displaced or blocked --------------------------------------------

def test_entry_point_named_reference_is_ignored(tmp_path, monkeypatch, capsys):
    install_fake(tmp_path, monkeypatch, """
        @hookimpl
        def minfer_applicable(ctx):
            return None
    """, name="reference")
    for allow in (None, "", "reference", "example"):  # no limit, none, the name itself, another
        pm = get_plugin_manager(allow=allow)
        ref = pm.get_plugin("reference")
        assert ref is not None and ref.__name__ == "minfer_core.reference"
        assert not pm.is_blocked("reference")
    assert "entry point 'reference' (minfer_fake_plugin_" in capsys.readouterr().err


@pytest.mark.parametrize("allow", ["", "reference", " , ", "reference,reference"])
def test_any_allowlist_keeps_the_reference(monkeypatch, allow):
    monkeypatch.setenv("MINFER_LOAD_PLUGINS", allow)
    assert "reference" in [n for n, _, _ in plugin_versions(get_plugin_manager())]


def test_set_blocked_refuses_the_reference():
    pm = get_plugin_manager(allow="")
    with pytest.raises(PluginError, match="cannot be blocked"):
        pm.set_blocked("reference")
    assert pm.get_plugin("reference") is not None


# -- minfer gates --backend without -m -----------------------------------------------------------

def test_gates_backend_without_model_is_checked(capsys):
    assert main(["gates", "--backend", "nosuch"]) == 2
    assert capsys.readouterr().err == "minfer: error: backend 'nosuch' cannot run here: no such plugin installed\n"
    assert main(["--backend", "reference", "gates"]) == 0
    out = capsys.readouterr().out
    assert "--backend reference first:" in out and "  prefill      reference > " in out
    assert "  decode_step  cuda_graphs" in out  # the reference wraps no step: the order is unchanged
    assert "  batch_step   cuda_graphs" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU view")
def test_gates_backend_that_cannot_run_here(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    pm = get_plugin_manager()
    if pm.get_plugin("mmq_triton") is None:
        pytest.skip("mmq_triton not installed")
    assert main(["gates", "--backend", "mmq_triton"]) == 2
    assert capsys.readouterr().err.startswith("minfer: error: backend 'mmq_triton' cannot run here: needs a CUDA")


def test_backend_check_is_a_backend_error(policy, plane_model):
    with pytest.raises(BackendError):
        build_plan(table_weights(plane_model), make_context("cpu", policy, env={}), manager(), policy,
                   backend="nosuch", register=False)


# -- gate declarations: data, checked; a bad one names the plugin ------------------------------------

from minfer_core.gates import declared_gates  # noqa: E402
from minfer_core.weights import Gate  # noqa: E402


@pytest.mark.parametrize("gate,problem", [
    (Gate("MINFER_X", True, "", "off"), "description: expected a non-empty string"),
    (Gate("MINFER_X", True, "on", ""), "off: a switch must say what \"0\" does"),
    (Gate("MINFER_X", 1, "on", "off"), "default: a switch takes True or False, got 1"),
    (Gate("MINFER_X", 1.0, "g", modes={0: "a", 1: "b"}), "default: expected one of the modes [0, 1], got 1.0"),
    (Gate("MINFER_X", 1, "g", modes={1: "b"}), "modes: expected {0: what off does"),
    (Gate("x_gate", True, "on", "off"), "the name must look like MINFER_SOMETHING"),
    (Gate("MINFER_X", True, "on", "off", labels=("",)), "labels: expected a list of label prefixes"),
])
def test_bad_gate_declaration_names_the_plugin(gate, problem):
    class Declares(F16StandIn):
        @hookimpl
        def minfer_gates(self):
            return [gate]

    with pytest.raises(PluginError) as e:
        declared_gates(manager(Declares()))
    assert str(e.value).startswith(f"plugin 'f16_wmma' hook minfer_gates: gate {gate.name!r}: {problem}")


def test_gate_declared_twice_is_an_error():
    class Twice(F16StandIn):
        @hookimpl
        def minfer_gates(self):
            return [Gate("MINFER_MMQ", True, "mine", "not mine")]

    from test_dispatch import MmqStandIn

    with pytest.raises(PluginError, match=r"gate MINFER_MMQ is already declared by '(mmq_triton|f16_wmma)'"):
        declared_gates(manager(MmqStandIn(), Twice()))


def test_gates_hook_must_return_a_list_of_gates():
    class Odd(F16StandIn):
        @hookimpl
        def minfer_gates(self):
            return {"MINFER_X": True}

    with pytest.raises(PluginError, match=r"^plugin 'f16_wmma' hook minfer_gates returned .*: expected a list of"):
        declared_gates(manager(Odd()))
