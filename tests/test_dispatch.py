"""Plan building: policy ranking, --backend, fuse-mode degradation and per-gate liveness.

The mmq_triton / f16_wmma / cuda_graphs stand-ins below offer exactly what gates.yaml documents
for each gate, with kernels made of reference math (dequantize + torch); they are registered on
a real plugin manager next to the built-in reference backend. Liveness runs the planned kernels
through the model's own :class:`~minfer_core.model.Runtime`, which records each dispatch label.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT, GGUFWriter

from minfer_core.commands.gates import open_header
from minfer_core.model_config import config_from_gguf
from minfer_core.dispatch import BackendError, build_plan, make_context, wrap_decode_step, wrap_step
from minfer_core.errors import UserError
from minfer_core.gates import declared_gates
from minfer_core.gguf_file import open_gguf
from minfer_core.hookspecs import hookimpl
from minfer_core.loader import weights_from_file
from minfer_core.model import Runtime
from minfer_core.plugins import get_plugin_manager
from minfer_core.policy import load_policy
from minfer_core.quants import QUANTS
from minfer_core.reference import dense
from minfer_core.weights import Activation, Candidate
from minfer_mmq_triton.routes import GATES, PLANE_BUILDERS
from minfer_mmq_triton.routes import declared_gates as mmq_gates
from minfer_mmq_triton.routes import fuse_proposal

GPU_CC = (9, 0)
LAYOUT_7B = Path("/work/shared/models/qwen2-7b-q4_k_m.layout.gguf.xz")


# -- a tiny qwen2 model written with gguf's own writer ----------------------------------------

_F16_AT = {QT.Q4_K: (0, 2), QT.Q6_K: (208,), QT.Q5_0: (0,), QT.Q8_0: (0,), QT.Q4_0: (0,)}


def random_rows(qtype: QT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with small finite f16 scales: uint8 (rows, row_bytes), or f32 values."""
    if qtype == QT.F32:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    q = QUANTS[qtype]
    b = rng.integers(0, 256, (rows, cols // q.block_size, q.type_size), dtype=np.uint8)
    for at in _F16_AT[qtype]:
        b[..., at:at + 2] = np.full(b.shape[:2], 0.002, np.float16).view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(rows, -1)


def write_tiny_model(path: Path, types: dict[str, QT] | None = None, n_layers: int = 2, seed: int = 0) -> Path:
    """A qwen2 model: width 256, 2 heads of 128 (1 KV head), ffn 512, vocab 32. ``types`` maps a
    tensor suffix (attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, output) to its type."""
    t = {"attn_q": QT.Q4_K, "attn_k": QT.Q4_K, "attn_v": QT.Q6_K, "attn_output": QT.Q4_K,
         "ffn_gate": QT.Q4_K, "ffn_up": QT.Q4_K, "ffn_down": QT.Q6_K, "output": QT.Q6_K} | (types or {})
    rng = np.random.default_rng(seed)
    E, KV, FF, V = 256, 128, 512, 32
    w = GGUFWriter(str(path), "qwen2")
    for k, v in {"embedding_length": E, "attention.head_count": 2, "attention.head_count_kv": 1,
                 "block_count": n_layers, "feed_forward_length": FF, "context_length": 64}.items():
        w.add_uint32(f"qwen2.{k}", v)
    w.add_float32("qwen2.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32("qwen2.rope.freq_base", 10000.0)

    def add(name: str, qtype: QT, rows: int, cols: int) -> None:
        data = random_rows(qtype, rows, cols, rng)
        w.add_tensor(name, data, raw_dtype=None if qtype == QT.F32 else qtype)

    add("token_embd.weight", QT.Q4_K, V, E)
    add("output.weight", t["output"], V, E)
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for i in range(n_layers):
        p = f"blk.{i}."
        for n in ("attn_norm", "ffn_norm"):
            w.add_tensor(p + n + ".weight", np.ones(E, np.float32))
        for n, rows, cols in (("attn_q", E, E), ("attn_k", KV, E), ("attn_v", KV, E), ("attn_output", E, E),
                              ("ffn_gate", FF, E), ("ffn_up", FF, E), ("ffn_down", E, FF)):
            add(p + n + ".weight", t[n], rows, cols)
        for n, rows in (("attn_q", E), ("attn_k", KV), ("attn_v", KV)):
            w.add_tensor(p + n + ".bias", (rng.standard_normal(rows) * 0.01).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def table_weights(path):
    """Matmul weights from the tensor table only (raw=None), as ``minfer gates -m`` reads them."""
    f = open_header(path)
    return weights_from_file(f, config_from_gguf(f), None)


def loaded_weights(path):
    f = open_gguf(path)
    return weights_from_file(f, config_from_gguf(f), torch.device("cpu"))


def test_q_and_k_share_one_weight_where_only_v_differs(plane_model, mixed_model, tmp_path):
    """q and k fuse into ``attn_qk`` (their rows, then their biases, one after the other) when v's type
    differs from theirs, as Q4_K_M's q6_K v layers; all three fuse when the types agree. Oracle: the
    file's own tensors, read by the GGUF reader."""
    uniform = write_tiny_model(tmp_path / "uniform.gguf", {"attn_v": QT.Q4_K})
    assert {w.role for w in loaded_weights(uniform) if w.name.startswith("blk.0.attn_")} == {"qkv", "o"}
    for path in (plane_model, mixed_model):  # v q6_K under q4_K q / k; v q8_0 under q5_0 q / k
        ws = {w.name: w for w in loaded_weights(path)}
        table = open_gguf(path).tensors
        assert "blk.0.attn_q" not in ws and "blk.0.attn_k" not in ws and ws["blk.0.attn_v"].role == "v"
        qk = ws["blk.0.attn_qk"]
        parts = [table[f"blk.0.attn_{x}.weight"] for x in "qk"]
        rows = [np.ascontiguousarray(e.data).view(np.uint8).reshape(e.shape[0], -1) for e in parts]
        assert qk.role == "qk" and qk.qtype == parts[0].qtype and qk.shape == (256 + 128, 256)
        assert torch.equal(qk.raw, torch.from_numpy(np.concatenate(rows)))
        bias = np.concatenate([np.ascontiguousarray(table[f"blk.0.attn_{x}.bias"].data).view(np.float32)
                               for x in "qk"])
        assert torch.equal(qk.bias, torch.from_numpy(bias))


# -- stand-ins for the project's plugins ------------------------------------------------------


def _ref_fn(weight, label_reads=("f32",)):
    def fn(x):
        if isinstance(x, Activation):
            x = x.plane.float() if "plane" in label_reads else x.f32
        y = x @ dense(weight).T
        return y + weight.bias if weight.bias is not None else y

    return fn


class MmqStandIn:
    """Offers what gates.yaml documents for mmq_triton; the kernels are reference math."""

    NAME = "mmq_triton"

    @hookimpl
    def minfer_applicable(self, ctx):
        cc = ctx.compute_capability
        if cc is None:
            return "needs a CUDA device with compute capability >= 8.0 (none here)"
        if tuple(cc) < (8, 0):
            return f"needs compute capability >= 8.0 (this GPU has {cc[0]}.{cc[1]})"
        return None

    @hookimpl
    def minfer_register_weight(self, weight, ctx):
        if weight.raw is not None and not ctx.gates["MINFER_MMQ_RAW"]:
            weight.planes["mmq_triton.f16"] = dense(weight).half()

    @hookimpl
    def minfer_matmul_candidates(self, weight, phase, ctx):
        qt, g = QT(weight.qtype), ctx.gates
        name = qt.name.lower()
        if phase == "decode":
            return [Candidate(self.NAME, f"mmq.gemv.{name}", _ref_fn(weight))]
        if not g["MINFER_MMQ"]:
            return None
        if not g["MINFER_MMQ_RAW"]:
            return [Candidate(self.NAME, f"mmq.raw_off.{name}", _ref_fn(weight))]
        nb = g["MINFER_MMQ_RAW_NB"] and (qt == QT.Q4_K or (qt == QT.Q6_K and g["MINFER_MMQ_Q6K_NB"]))
        if not nb:
            return [Candidate(self.NAME, f"mmq.generic.{name}", _ref_fn(weight))]
        builder = g["MINFER_MMQ_Q4K_DSC" if qt == QT.Q4_K else "MINFER_MMQ_Q6K_EXP"]
        reads = ("plane",) if g["MINFER_MMQ_A_TRANSPOSE"] else ("f32",)
        label = f"mmq.nb.{name}" if builder else f"mmq.nb.raw.{name}"
        return [Candidate(self.NAME, label, _ref_fn(weight, reads), reads=reads)]

    @hookimpl
    def minfer_gates(self):
        return mmq_gates()  # the real plugin's declarations: the gates are data

    @hookimpl
    def minfer_fuse_proposal(self, weights, readers, ctx):
        return fuse_proposal(weights, readers, ctx)

    @staticmethod
    def _write(mode):
        return lambda y: Activation(None if mode == 2 else y, y.to(torch.bfloat16))

    @hookimpl
    def minfer_prepass_candidates(self, ctx):
        return [Candidate(self.NAME, "mmq.prepass", lambda x: Activation(x, x.to(torch.bfloat16)))]

    @hookimpl
    def minfer_rmsnorm_candidates(self, ctx):
        mode, write = ctx.fuse_mode, self._write(ctx.fuse_mode)
        fn = lambda x, w, eps: write(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)  # noqa: E731
        return [Candidate(self.NAME, f"mmq.fuse{mode}.rmsnorm", fn)] if mode else None

    @hookimpl
    def minfer_swiglu_candidates(self, ctx):
        mode, write = ctx.fuse_mode, self._write(ctx.fuse_mode)
        fn = lambda gu: write(F.silu(gu.chunk(2, -1)[0]) * gu.chunk(2, -1)[1])  # noqa: E731
        return [Candidate(self.NAME, f"mmq.fuse{mode}.swiglu", fn)] if mode else None


class F16StandIn:
    """f16_wmma: serves every type but Q8_0, in both phases, reading f32."""

    NAME = "f16_wmma"

    @hookimpl
    def minfer_matmul_candidates(self, weight, phase, ctx):
        if QT(weight.qtype) == QT.Q8_0:
            return None
        return [Candidate(self.NAME, "f16.gemm" if phase == "prefill" else "f16.gemv", _ref_fn(weight))]


class GraphsStandIn:
    NAME = "cuda_graphs"

    @hookimpl
    def minfer_wrap_decode_step(self, step, ctx):
        def wrapped(tokens, positions):
            return ("graph", step(tokens, positions))

        return wrapped

    @hookimpl
    def minfer_wrap_batch_step(self, step, padding, ctx):
        def wrapped(inputs):
            return ("batch graph", padding, step(inputs))

        return wrapped


def manager(*plugins, trace: bool = False):
    """The real manager without entry points, plus stand-ins (registered in the order given)."""
    pm = get_plugin_manager(allow="", trace=trace)
    for p in plugins:
        pm.unblock(p.NAME)  # the installed plugin of that name is held back by allow=""
        pm.register(p, name=p.NAME)
    return pm


def all_standins():
    return (F16StandIn(), GraphsStandIn(), MmqStandIn())  # deliberately not in policy order


def gate_table():
    """The gates the stand-ins declare (the real mmq_triton's), as the core collects them."""
    return declared_gates(manager(MmqStandIn()))


def gpu_ctx(policy, env=None, cc=GPU_CC):
    ctx = make_context("cpu", policy, env={} if env is None else env, gates=gate_table())
    ctx.compute_capability = cc  # kernels are reference math: they run anywhere
    return ctx


@pytest.fixture(scope="module")
def policy():
    return load_policy(known_plugins={"reference", "mmq_triton", "f16_wmma", "cuda_graphs", "example"})


@pytest.fixture(scope="module")
def plane_model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "plane.gguf")


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory):
    types = {"attn_q": QT.Q5_0, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0, "output": QT.Q8_0}
    return write_tiny_model(tmp_path_factory.mktemp("m") / "mixed.gguf", types)


def with_order(policy, tmp_path, **order):
    """A copy of the policy file with some ``order`` lists replaced."""
    import yaml

    data = yaml.safe_load(policy.path.read_text())
    data["order"].update(order)
    p = tmp_path / "policy.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_policy(p, known_plugins=set(policy.plugins()) | {"thirdparty"})


# -- ranking ----------------------------------------------------------------------------------


def test_policy_order_decides_not_registration_order(policy, plane_model, tmp_path):
    ws = table_weights(plane_model)
    plan = build_plan(ws, gpu_ctx(policy), manager(*all_standins()), policy, register=False)
    assert {c.plugin for c in plan.prefill.values()} == {"mmq_triton"}
    assert {c.plugin for c in plan.decode.values()} == {"mmq_triton"}
    swapped = with_order(policy, tmp_path, prefill=["f16_wmma", "mmq_triton"])
    plan = build_plan(ws, gpu_ctx(swapped), manager(MmqStandIn(), F16StandIn()), swapped, register=False)
    assert {c.label for c in plan.prefill.values()} == {"f16.gemm"}
    assert {c.plugin for c in plan.decode.values()} == {"mmq_triton"}


def test_unplaced_plugin_is_never_chosen(policy, plane_model, tmp_path):
    class ThirdParty(F16StandIn):
        NAME = "thirdparty"

        @hookimpl
        def minfer_matmul_candidates(self, weight, phase, ctx):
            return [Candidate(self.NAME, "third.gemm", _ref_fn(weight))]

    ws = table_weights(plane_model)
    plan = build_plan(ws, gpu_ctx(policy), manager(ThirdParty()), policy, register=False)
    assert all(c.plugin == "reference" for c in plan.prefill.values())
    assert any("thirdparty" in n and "does not place" in n for n in plan.notes)
    placed = with_order(policy, tmp_path, prefill=["thirdparty", "mmq_triton"])
    plan = build_plan(ws, gpu_ctx(placed), manager(ThirdParty()), placed, register=False)
    assert {c.label for c in plan.prefill.values()} == {"third.gemm"}


def test_reference_alone_serves_everything(policy, mixed_model):
    ws = table_weights(mixed_model)
    plan = build_plan(ws, make_context("cpu", policy, env={}), manager(), policy, register=False)
    for w in ws:
        for phase in ("prefill", "decode"):
            assert getattr(plan, phase)[w.name].label == f"ref.{QT(w.qtype).name.lower()}"
    assert plan.attention["prefill"].plugin == plan.attention["decode"].plugin == "reference"
    assert plan.fuse_mode == 0 and plan.fuse.proposer is None and plan.decode_step is None
    assert plan.fuse_reason == "no plugin offers fused producers"


def test_candidate_must_name_its_plugin(policy, plane_model):
    class Liar(F16StandIn):
        @hookimpl
        def minfer_matmul_candidates(self, weight, phase, ctx):
            return [Candidate("mmq_triton", "fake", _ref_fn(weight))]

    with pytest.raises(UserError, match="plugin 'f16_wmma' offered .* expected Candidates naming 'f16_wmma'"):
        build_plan(table_weights(plane_model), gpu_ctx(policy), manager(Liar()), policy, register=False)


# -- --backend --------------------------------------------------------------------------------


def test_backend_goes_first_for_what_it_serves(policy, mixed_model):
    ws = table_weights(mixed_model)
    plan = build_plan(ws, gpu_ctx(policy), manager(*all_standins()), policy, backend="f16_wmma", register=False)
    for w in ws:
        want = "mmq_triton" if QT(w.qtype) == QT.Q8_0 else "f16_wmma"  # f16_wmma cannot serve Q8_0
        assert plan.prefill[w.name].plugin == plan.decode[w.name].plugin == want, w.name
    assert plan.attention["decode"].plugin == "reference"  # nobody else offers attention
    assert plan.decode_step.plugin == "cuda_graphs"


def test_backend_reference_always_works(policy, mixed_model):
    ws = table_weights(mixed_model)
    for ctx in (gpu_ctx(policy), make_context("cpu", policy, env={})):
        plan = build_plan(ws, ctx, manager(*all_standins()), policy, backend="reference", register=False)
        assert {c.plugin for c in plan.prefill.values()} | {c.plugin for c in plan.decode.values()} == {"reference"}
        assert plan.fuse_mode == 0  # no chosen consumer reads the plane


@pytest.mark.parametrize("backend,pm_args,pattern", [
    ("mmq_triton", {}, r"^backend 'mmq_triton' cannot run here: needs a CUDA device with compute capability >= 8.0"),
    # not registered: "not installed", or "blocked (not in MINFER_LOAD_PLUGINS)" where it is installed
    ("cuda_graphs", {"skip": "cuda_graphs"}, r"^backend 'cuda_graphs' cannot run here: (not installed|blocked)"),
    ("nosuch", {}, r"^backend 'nosuch' cannot run here: no such plugin installed"),
])
def test_backend_that_cannot_run_is_one_line(policy, plane_model, backend, pm_args, pattern):
    plugins = [p for p in all_standins() if p.NAME != pm_args.get("skip")]
    with pytest.raises(BackendError, match=pattern) as e:
        build_plan(table_weights(plane_model), make_context("cpu", policy, env={}), manager(*plugins), policy,
                   backend=backend, register=False)
    assert "\n" not in str(e.value) and isinstance(e.value, UserError)


def test_backend_blocked_is_an_error(policy, plane_model):
    pm = get_plugin_manager(allow="", blocked=["mmq_triton"])
    with pytest.raises(BackendError, match=r"backend 'mmq_triton' cannot run here: blocked \(-p no:mmq_triton\)"):
        build_plan(table_weights(plane_model), gpu_ctx(policy), pm, policy, backend="mmq_triton", register=False)


def test_old_gpu_turns_mmq_off_with_reason(policy, plane_model):
    plan = build_plan(table_weights(plane_model), gpu_ctx(policy, cc=(7, 5)), manager(*all_standins()), policy,
                      register=False)
    assert "7.5" in plan.fuse.off_reason and plan.fuse_mode == 0 and "7.5" in plan.fuse_reason
    assert plan.fuse.off_reason.startswith("mmq_triton cannot run here: ")
    assert {c.plugin for c in plan.prefill.values()} == {"f16_wmma"}
    assert plan.model_fuse_mode == 2  # what the model itself would allow


# -- fuse mode and its degradations -----------------------------------------------------------


def plan_for(policy, weights, env=None, **kw):
    return build_plan(weights, gpu_ctx(policy, env), manager(*all_standins()), policy, register=False, **kw)


def test_plane_only_model_keeps_mode_2(policy, plane_model):
    plan = plan_for(policy, table_weights(plane_model))
    assert (plan.fuse_mode, plan.fuse_reason) == (2, "")
    assert set(plan.producers) == {"rmsnorm", "swiglu", "prepass"}
    assert plan.producers["rmsnorm"].label == "mmq.fuse2.rmsnorm" and plan.a_transpose


def test_7b_layout_template_keeps_mode_2(policy, tmp_path):
    if not LAYOUT_7B.exists():
        pytest.skip(f"{LAYOUT_7B} not here")
    ws = table_weights(LAYOUT_7B)  # read straight from the .xz
    plain = tmp_path / "7b.gguf"
    plain.write_bytes(lzma.decompress(LAYOUT_7B.read_bytes()))
    assert [(w.name, w.qtype) for w in table_weights(plain)] == [(w.name, w.qtype) for w in ws]
    types = {QT(w.qtype) for w in ws}
    assert types == {QT.Q4_K, QT.Q6_K}, types
    plan = plan_for(policy, ws)
    assert plan.fuse_mode == 2 and plan.model_fuse_mode == 2
    assert {c.label for c in plan.prefill.values()} == {"mmq.nb.q4_k", "mmq.nb.q6_k"}


@pytest.mark.parametrize("fuse_env", [None, "2"])
def test_mixed_quant_degrades_to_1_whatever_was_requested(policy, mixed_model, fuse_env):
    ws = table_weights(mixed_model)
    env = {} if fuse_env is None else {"MINFER_MMQ_A_FUSE": fuse_env}
    plan = plan_for(policy, ws, env)
    first = next(w for w in ws if QT(w.qtype) not in (QT.Q4_K, QT.Q6_K))
    assert plan.fuse_mode == 1
    assert f"{first.name} is {QT(first.qtype).name}" in plan.fuse_reason
    assert plan.producers["swiglu"].label == "mmq.fuse1.swiglu"


def test_2d_f32_matmul_weight_degrades(policy, tmp_path):
    ws = table_weights(write_tiny_model(tmp_path / "f32.gguf", {"attn_output": QT.F32}))
    plan = plan_for(policy, ws)
    assert plan.fuse_mode == 1 and "blk.0.attn_output is a 2-D F32 matmul weight" in plan.fuse_reason


def test_readers_force_mode_1(policy, plane_model):
    plan = plan_for(policy, table_weights(plane_model), readers=["--dump-activations"])
    assert plan.fuse_mode == 1 and "--dump-activations" in plan.fuse_reason


@pytest.mark.parametrize("env,mode", [
    ({"MINFER_MMQ_A_FUSE": "1"}, 1), ({"MINFER_MMQ_A_FUSE": "0"}, 0), ({"MINFER_MMQ_A_FUSE": "yes"}, 0),
    *[({g: "0"}, 0) for g in GATES[:5]],
    ({"MINFER_MMQ_Q6K_EXP": "0", "MINFER_MMQ_Q4K_DSC": "0"}, 2),
])
def test_fuse_mode_from_gates(policy, plane_model, env, mode):
    plan = plan_for(policy, table_weights(plane_model), env)
    assert plan.fuse_mode == mode, plan.fuse_reason
    assert ("rmsnorm" in plan.producers) == bool(mode)
    for g, v in env.items():
        if mode == 0 and g != "MINFER_MMQ_A_FUSE":
            assert g in plan.fuse_reason


def test_mode_2_needs_every_consumer_to_read_the_plane(policy, plane_model, tmp_path):
    class Q6Only(F16StandIn):
        NAME = "thirdparty"

        @hookimpl
        def minfer_matmul_candidates(self, weight, phase, ctx):
            if QT(weight.qtype) == QT.Q6_K and phase == "prefill":
                return [Candidate(self.NAME, "third.q6_k", _ref_fn(weight))]

    pol = with_order(policy, tmp_path, prefill=["thirdparty", "mmq_triton", "f16_wmma"])
    pm = manager(*all_standins(), Q6Only())
    plan = build_plan(table_weights(plane_model), gpu_ctx(pol), pm, pol, register=False)
    assert plan.fuse_mode == 1 and "runs third.q6_k (thirdparty), which reads the f32 activation" in plan.fuse_reason


def test_fuse_mode_hook_can_lower_not_raise(policy, plane_model):
    class Veto(F16StandIn):
        NAME = "thirdparty"

        def __init__(self, answer):
            self.answer = answer

        @hookimpl
        def minfer_fuse_mode(self, model, requested, ctx):
            return self.answer

    ws = table_weights(plane_model)
    plan = build_plan(ws, gpu_ctx(policy), manager(*all_standins(), Veto((1, "measured slower"))), policy, register=False)
    assert plan.fuse_mode == 1 and plan.fuse_reason == "thirdparty: measured slower"
    assert plan.producers["rmsnorm"].label == "mmq.fuse1.rmsnorm"
    plan = build_plan(ws, gpu_ctx(policy, {"MINFER_MMQ_A_FUSE": "1"}), manager(*all_standins(), Veto((2, "more"))),
                      policy, register=False)
    assert plan.fuse_mode == 1  # a plugin may lower the mode, never raise it
    with pytest.raises(UserError, match="must return None or"):
        build_plan(ws, gpu_ctx(policy), manager(*all_standins(), Veto(1)), policy, register=False)


def test_real_mixed_model_degrades_naming_the_tensor(policy, qwen_path):
    ws = table_weights(qwen_path)
    plan = plan_for(policy, ws)
    assert plan.fuse_mode == 1 == plan.model_fuse_mode
    named = plan.fuse_reason.split("degraded to 1: ")[1].split(" is ")[0]
    # oracle: the file's own tensor table, read by the GGUF reader (a fused q|k or q|k|v weight: its q)
    table = open_gguf(qwen_path).tensors
    entry = table.get(named + ".weight") or table.get(named) or \
        table[re.sub(r"attn_qkv?$", "attn_q", named) + ".weight"]
    assert entry.qtype not in (QT.Q4_K, QT.Q6_K)
    assert f"is {entry.qtype.name}" in plan.fuse_reason
    before = [w for w in ws[:[w.name for w in ws].index(named)]]
    assert all(QT(w.qtype) in (QT.Q4_K, QT.Q6_K) for w in before)  # it is the first offender


# -- liveness: each gate's label appears under the default and is gone at "0" ----------------


def run_labels(policy, path, env, make_pm=lambda: manager(*all_standins()), decode: bool = True):
    """Load (with registration) and run one prefill of 20 rows (and one decode row) through the
    model's Runtime; return the dispatch label counts."""
    ws = loaded_weights(path)
    ctx = gpu_ctx(policy, env)
    plan = build_plan(ws, ctx, make_pm(), policy)
    rt = Runtime(plan, {w.name: w for w in ws})
    byname = {w.name: w for w in ws}
    torch.manual_seed(0)
    for T in (20, 1) if decode else (20,):
        h = torch.randn(T, 256)
        ones = torch.ones(256)
        for i in range(2):
            a = rt.rmsnorm(h, ones, 1e-6) if T > 1 else h
            for n in (f"blk.{i}.attn_{x}" for x in ("qkv", "qk", "q", "k", "v")):
                if n in byname:
                    rt.linear(n, a)
            o = torch.randn(T, 256)
            rt.linear(f"blk.{i}.attn_output", rt.produce(o) if T > 1 else o)
            a = rt.rmsnorm(h, ones, 1e-6) if T > 1 else h
            gu = rt.linear(f"blk.{i}.ffn_gate_up", a)
            rt.linear(f"blk.{i}.ffn_down", rt.swiglu(gu) if T > 1 else gu[:, :512])
    return rt.counts, plan


def _alive(counts, prefixes):
    return sorted(label for label in counts if any(label.startswith(p) for p in prefixes))


@pytest.mark.parametrize("model", ["plane_model", "mixed_model"])
@pytest.mark.parametrize("gate", GATES + PLANE_BUILDERS)
def test_gate_liveness(policy, request, model, gate):
    path = request.getfixturevalue(model)
    prefixes = gate_table()[gate].labels
    counts, plan = run_labels(policy, path, {})
    assert _alive(counts, prefixes), f"{gate}: none of {prefixes} in {sorted(counts)}"
    off, _ = run_labels(policy, path, {gate: "0"})
    assert not _alive(off, prefixes), f"{gate}=0 still runs {_alive(off, prefixes)}"


def real_mmq_manager():
    """The installed mmq_triton plugin alone (through its entry point), or a skip."""
    from minfer_core.plugins import installed_entry_points

    if "mmq_triton" not in installed_entry_points():
        pytest.skip("mmq_triton is not installed (pip install -e plugins/mmq_triton)")
    return get_plugin_manager(allow="mmq_triton")


@pytest.mark.parametrize("model", ["plane_model", "mixed_model"])
def test_gate_liveness_real_mmq_triton(policy, request, model, monkeypatch):
    """The same proof with the real kernels, run by Triton's interpreter on the CPU."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    real_mmq_manager()
    path = request.getfixturevalue(model)
    base, plan = run_labels(policy, path, {}, real_mmq_manager, decode=False)  # decode reads no gate
    assert plan.fuse_mode == (2 if model == "plane_model" else 1), plan.fuse_reason
    for gate in GATES + PLANE_BUILDERS:
        prefixes = gate_table()[gate].labels
        assert _alive(base, prefixes), f"{gate}: none of {prefixes} in {sorted(base)}"
        off, _ = run_labels(policy, path, {gate: "0"}, real_mmq_manager, decode=False)
        assert not _alive(off, prefixes), f"{gate}=0 still runs {_alive(off, prefixes)}"


def test_mode_2_run_is_sound_and_matches_reference(policy, plane_model):
    counts, plan = run_labels(policy, plane_model, {})
    assert plan.fuse_mode == 2 and any(k.startswith("mmq.fuse2.") for k in counts)
    ws = loaded_weights(plane_model)
    pm, ref_pm = manager(*all_standins()), manager()
    got = build_plan(ws, gpu_ctx(policy), pm, policy)
    want = build_plan(loaded_weights(plane_model), gpu_ctx(policy), ref_pm, policy, backend="reference")
    x = torch.randn(20, 256)
    rt_got, rt_want = Runtime(got, {w.name: w for w in ws}), Runtime(want, {w.name: w for w in ws})
    a, b = rt_got.rmsnorm(x, torch.ones(256), 1e-6), rt_want.rmsnorm(x, torch.ones(256), 1e-6)
    assert a.f32 is None and b.f32 is not None  # mode 2 really skips the f32 write
    y, y_ref = rt_got.linear("blk.0.ffn_gate_up", a), rt_want.linear("blk.0.ffn_gate_up", b)
    assert ((y - y_ref).norm() / y_ref.norm()).item() < 1e-2  # bf16 activation plane vs f32 rows


# -- resolved once: no environment after load ---------------------------------------------------


class CountingEnv(dict):
    def __init__(self, *a):
        super().__init__(*a)
        self.reads: list[str] = []

    def get(self, key, default=None):
        self.reads.append(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.reads.append(key)
        return super().__getitem__(key)


def test_gates_read_once_at_load_and_never_in_forward(policy, mixed_model, monkeypatch):
    env = CountingEnv({"MINFER_MMQ_A_FUSE": "1"})
    table = gate_table()
    ctx = make_context("cpu", policy, env=env, gates=table)
    assert sorted(env.reads) == sorted(table)  # each declared gate read exactly once
    assert set(GATES + PLANE_BUILDERS) <= set(table)
    ctx.compute_capability = GPU_CC
    ws = loaded_weights(mixed_model)
    plan = build_plan(ws, ctx, manager(*all_standins()), policy)
    assert len(env.reads) == len(table) and plan.fuse_mode == 1

    class NoEnv(dict):
        def __getitem__(self, k):
            raise AssertionError(f"forward read {k}")

        get = __getitem__

    monkeypatch.setattr(os, "environ", NoEnv())
    monkeypatch.setattr(os, "getenv", lambda *a: (_ for _ in ()).throw(AssertionError(f"forward read {a}")))
    rt = Runtime(plan, {w.name: w for w in ws})
    x = torch.randn(20, 256)
    rt.linear("blk.0.attn_output", rt.produce(x))
    rt.linear("blk.0.ffn_down", rt.swiglu(rt.linear("blk.0.ffn_gate_up", rt.rmsnorm(x, torch.ones(256), 1e-6))))
    rt.linear("output", x[:1])
    monkeypatch.undo()
    assert sum(rt.counts.values()) == 7, rt.counts  # prepass, o, rmsnorm, gate_up, swiglu, down, output


# -- decode step and tracing --------------------------------------------------------------------


def test_decode_step_wrapped_by_policy_choice(policy, plane_model, tmp_path):
    ws = table_weights(plane_model)
    step = lambda t, p: "logits"  # noqa: E731
    pm = manager(*all_standins())
    plan = build_plan(ws, gpu_ctx(policy), pm, policy, register=False)
    assert wrap_decode_step(step, gpu_ctx(policy), pm, policy, plan)(1, 2) == ("graph", "logits")
    none = with_order(policy, tmp_path, decode_step=[])
    plan = build_plan(ws, gpu_ctx(none), pm, none, register=False)
    assert plan.decode_step is None and wrap_decode_step(step, gpu_ctx(none), pm, none, plan) is step
    pm = get_plugin_manager(allow="", blocked=["cuda_graphs"])
    plan = build_plan(ws, gpu_ctx(policy), pm, policy, register=False)
    assert plan.decode_step is None


def test_batch_step_wrapped_by_policy_choice(policy, plane_model, tmp_path):
    """The batched engine's step is ranked by ``order.batch_step`` like the decode step; the hook
    receives the padding row; no listed wrapper, a blocked one, or a policy leaving the key out
    (it is optional) leaves the step plain."""
    ws = table_weights(plane_model)
    step = lambda inputs: "logits"  # noqa: E731
    padding = torch.arange(6)
    pm = manager(*all_standins())
    plan = build_plan(ws, gpu_ctx(policy), pm, policy, register=False)
    assert plan.batch_step_order == ["cuda_graphs"] and plan.batch_step.plugin == "cuda_graphs"
    assert plan.labels_by_class()["batch_step"] == "cuda_graphs.batch_step"
    kind, got_padding, out = wrap_step("batch_step", step, gpu_ctx(policy), pm, plan, padding=padding)(None)
    assert (kind, out) == ("batch graph", "logits") and got_padding is padding
    for order in ([], ["reference"]):  # nobody, or only a plugin that wraps nothing
        other = with_order(policy, tmp_path, batch_step=order)
        plan = build_plan(ws, gpu_ctx(other), pm, other, register=False)
        assert plan.batch_step is None and plan.batch_step_order == []
        assert wrap_step("batch_step", step, gpu_ctx(other), pm, plan, padding=padding) is None
    blocked = get_plugin_manager(allow="", blocked=["cuda_graphs"])
    plan = build_plan(ws, gpu_ctx(policy), blocked, policy, register=False)
    assert plan.batch_step is None and plan.decode_step is None and plan.batch_step_order == []
    assert wrap_step("batch_step", step, gpu_ctx(policy), blocked, plan, padding=padding) is None
    import yaml

    data = yaml.safe_load(policy.path.read_text())
    del data["order"]["batch_step"]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data))
    old = load_policy(tmp_path / "old.yaml", known_plugins=set(policy.plugins()))
    assert old.order["batch_step"] == []
    plan = build_plan(ws, gpu_ctx(old), pm, old, register=False)
    assert plan.batch_step is None and plan.decode_step.plugin == "cuda_graphs"


def test_trace_prints_hook_calls_and_winners(policy, mixed_model, capsys):
    build_plan(table_weights(mixed_model), gpu_ctx(policy), manager(*all_standins(), trace=True), policy,
               register=False)
    err = capsys.readouterr().err
    assert "[minfer plugins] minfer_applicable() mmq_triton -> None" in err
    assert "minfer_matmul_candidates(weight=blk.0.attn_qk, phase='prefill') mmq_triton -> [mmq.generic.q5_0]" in err
    assert "prefill blk.0.attn_qk (Q5_0 384x256): mmq_triton:mmq.generic.q5_0 > f16_wmma:f16.gemm > " \
           "reference:ref.q5_0  => mmq.generic.q5_0" in err
    assert "fuse mode 1 (mode 2 degraded to 1: blk.0.attn_qk is Q5_0" in err


# -- groups: weights sharing an input, one kernel ------------------------------------------------


class MmqGroupStandIn(MmqStandIn):
    """The stand-in mmq_triton that also offers one decode kernel for weights sharing an input."""

    @hookimpl
    def minfer_matmul_group_candidates(self, weights, phase, ctx):
        fns = [_ref_fn(w) for w in weights]

        def fn(x, norm=None):
            x = x if norm is None else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm[1]) * norm[0]
            return [f(x) for f in fns]

        return [Candidate(self.NAME, "mmq.group", fn, fuses=("rmsnorm",))] if phase == "decode" else None


def test_input_groups_are_the_unfused_weights_of_one_input(plane_model, tmp_path):
    """q|k and v (types differ) form a group per layer; a layer whose q, k and v fuse into one has none."""
    from minfer_core.loader import input_groups

    groups = [[w.name for w in g] for g in input_groups(table_weights(plane_model))]
    assert groups == [["blk.0.attn_qk", "blk.0.attn_v"], ["blk.1.attn_qk", "blk.1.attn_v"]]
    assert input_groups(table_weights(write_tiny_model(tmp_path / "u.gguf", {"attn_v": QT.Q4_K}))) == []


def test_a_group_kernel_replaces_its_members_in_decode(policy, plane_model):
    """The group's one call gives what its members give one by one (oracle: rmsnorm, then each weight
    dequantized by the reference), and runs instead of them."""
    ws = loaded_weights(plane_model)
    plan = build_plan(ws, gpu_ctx(policy), manager(F16StandIn(), MmqGroupStandIn()), policy)
    names = ("blk.0.attn_qk", "blk.0.attn_v")
    assert set(plan.decode_groups) == {names, ("blk.1.attn_qk", "blk.1.attn_v")}
    assert plan.labels_by_class()["decode_groups"] == [
        {"classes": "qk + v", "label": "mmq.group", "plugin": "mmq_triton", "groups": 2}]
    rt = Runtime(plan, {w.name: w for w in ws})
    h, nw = torch.randn(1, 256), torch.rand(256) + 0.5
    ys = rt.decode_normed(list(names), h, (nw, 1e-6))
    x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * nw
    byname = {w.name: w for w in ws}
    for y, n in zip(ys, names):
        torch.testing.assert_close(y, x @ dense(byname[n]).T + byname[n].bias)
    assert rt.counts["mmq.group"] == 1 and not any(label.startswith("mmq.gemv") for label in rt.counts)


def test_a_group_kernel_runs_only_where_its_plugin_serves_every_member(policy, plane_model, tmp_path):
    """The policy still decides: a decode order placing another plugin first, or --backend, keeps the
    members on their own kernels."""
    ws = table_weights(plane_model)
    f16_first = with_order(policy, tmp_path, decode=["f16_wmma", "mmq_triton"])
    for pol, backend in ((f16_first, None), (policy, "reference")):
        plan = build_plan(ws, gpu_ctx(pol), manager(F16StandIn(), MmqGroupStandIn()), pol, backend, register=False)
        assert plan.decode_groups == {} and plan.decode["blk.0.attn_v"].plugin != "mmq_triton"
