"""Plan building: every hook runs here, once, at load; the result is a table the forward reads.

:func:`make_context` resolves the gates once; :func:`build_plan` asks each applicable plugin,
registers the weights, settles the fuse mode (with its degradations) and ranks every candidate by
the policy's order for its class of work (``--backend`` first), the reference backend last.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from gguf import GGMLQuantizationType as QT

from .errors import UserError
from .gates import FUSE_GATE, FUSE_REQUIRES, gate_values, resolve_gates
from .plugins import BUILTIN, PROJECT_PLUGINS, call_each
from .quants import PLANE_TYPES
from .weights import Activation, Candidate, LoadContext, Weight

PHASES = ("prefill", "decode")
ATTENTION_PHASES = PHASES + ("paged_decode",)  # paged_decode: one query row per entry of a batch
PRODUCERS = ("rmsnorm", "swiglu")
PREPASS = "prepass"
DECODE_OPS = ("decode_rmsnorm", "decode_rope_kv")  # single-token fused ops: the decode order, no gate
PREFILL_OPS = ("prefill_rope_kv",)  # multi-row fused ops: the prefill order, no gate
STEPS = ("decode_step", "prefill_step")  # whole steps a plugin may wrap (minfer_wrap_<step>)
MMQ_GATE, TRANSPOSE_GATE = "MINFER_MMQ", "MINFER_MMQ_A_TRANSPOSE"


class BackendError(UserError):
    """``--backend NAME`` names a plugin that cannot run here."""


@dataclass
class Plan:
    """What the forward runs: one candidate per (phase, tensor), producers, attention."""

    prefill: dict[str, Candidate]
    decode: dict[str, Candidate]
    producers: dict[str, Candidate]  # 'rmsnorm', 'swiglu' (fuse mode > 0), 'prepass' (A_TRANSPOSE in force)
    attention: dict[str, Candidate]  # 'prefill', 'decode', 'paged_decode'
    fuse_mode: int
    fuse_reason: str
    a_transpose: bool
    decode_step: Optional[Candidate]
    mmq_off_reason: str  # "" when the mmq path can run here
    notes: list[str] = field(default_factory=list)
    model_fuse_mode: int = 0  # what the model itself allows (the mmq path assumed available)
    model_fuse_reason: str = ""
    applicable: dict[str, Optional[str]] = field(default_factory=dict)  # plugin -> None or why not
    tensors: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (class, qtype)
    decode_step_order: list[str] = field(default_factory=list)
    decode_ops: dict[str, Candidate] = field(default_factory=dict)  # 'decode_rmsnorm', 'decode_rope_kv'
    prefill_ops: dict[str, Candidate] = field(default_factory=dict)  # 'prefill_rope_kv'
    prefill_step: Optional[Candidate] = None
    released_raw: int = 0  # bytes of raw GGUF blocks released because planes replace them
    prefill_step_order: list[str] = field(default_factory=list)

    def labels_by_class(self) -> dict:
        """Chosen labels grouped by tensor class and quant type (for ``minfer gates -m``)."""
        out: dict[str, Any] = {}
        for phase in PHASES:
            table = getattr(self, phase)
            rows = Counter((*self.tensors[n], c.label, c.plugin) for n, c in table.items())
            out[phase] = [{"class": k[0], "qtype": k[1], "label": k[2], "plugin": k[3], "tensors": n}
                          for k, n in sorted(rows.items())]
        out["producers"] = {k: c.label for k, c in self.producers.items()}
        out["attention"] = {k: c.label for k, c in self.attention.items()}
        out["decode_ops"] = {k: c.label for k, c in self.decode_ops.items()}
        out["prefill_ops"] = {k: c.label for k, c in self.prefill_ops.items()}
        out["decode_step"] = self.decode_step.label if self.decode_step else None
        out["prefill_step"] = self.prefill_step.label if self.prefill_step else None
        return out


def make_context(device, policy, env: Mapping[str, str] = os.environ, trace: bool = False) -> LoadContext:
    """The load context: device, compute capability and the gates, resolved once from ``env``."""
    device = torch.device(device)
    cc = None
    if device.type == "cuda" and torch.cuda.is_available():
        cc = tuple(torch.cuda.get_device_capability(device))
    return LoadContext(device, cc, gate_values(resolve_gates(policy, env)), trace=trace)


def ranking(policy, work: str, backend: Optional[str] = None, last_resort: bool = True) -> list[str]:
    """Plugins in the order they win ``work``: ``backend`` first, then the policy's, reference last."""
    order = [p for p in policy.order[work] if p != backend]
    if backend:
        order.insert(0, backend)
    if last_resort and BUILTIN not in order:
        order.append(BUILTIN)
    return order


def plane_offence(w: Weight) -> Optional[str]:
    """Why this weight clears the plane-only flag (mode 2 unsound), or None if the plane family reads it."""
    qt = QT(w.qtype)
    if qt in PLANE_TYPES:
        return None
    if qt == QT.F32:
        return f"{w.name} is a 2-D F32 matmul weight, whose GEMM reads the f32 activation"
    return f"{w.name} is {qt.name}, which the plane family cannot read (only Q4_K and Q6_K)"


def fuse_ladder(gates: Mapping[str, Any], mmq_off_reason: str, offence: Optional[str],
                readers: Sequence[str] = ()) -> tuple[int, str]:
    """The fuse mode the gates, the mmq path and the weight mix allow, and why (seed §3.1)."""
    if mmq_off_reason:
        return 0, f"mmq path off: {mmq_off_reason}"
    off = [g for g in FUSE_REQUIRES if not gates[g]]
    if off:
        return 0, f"{', '.join(off)} off (fused producers need the whole plane path)"
    requested = gates[FUSE_GATE]
    if requested < 2:
        return requested, "" if requested else f"{FUSE_GATE} resolved to 0"
    if offence:
        return 1, f"mode 2 degraded to 1: {offence}"
    if readers:
        return 1, f"mode 2 degraded to 1: {', '.join(readers)} reads the f32 activations"
    return 2, ""


def tensor_class(w: Weight) -> str:
    return w.role or re.sub(r"^blk\.\d+\.", "", w.name).removesuffix(".weight")


def build_plan(weights: list[Weight], ctx: LoadContext, pm, policy, backend: Optional[str] = None, *,
               model: Any = None, readers: Sequence[str] = (), register: bool = True) -> Plan:
    """Resolve everything once. ``readers``: debug readers of f32 activations in force (they force
    mode 1). ``register=False`` plans without building anything (``minfer gates -m``)."""
    log = getattr(pm, "log", lambda msg: None)
    # 1. who can run here (an explicit --backend that cannot is an error)
    applicable = _applicability(pm, ctx, backend)
    usable = [n for n, why in applicable.items() if why is None]
    mmq_names = policy.gates[MMQ_GATE].enables
    mmq_off = "" if any(applicable.get(n, "x") is None for n in mmq_names) else "; ".join(
        f"{n} cannot run here: {applicable.get(n) or _absent(pm, n)}" for n in mmq_names)

    # 2. registration; the fuse ladder as the seed has it (gates, mmq path, weight mix, readers)
    if mmq_off:  # before registration: a fallback builds its own cache where mmq cannot run
        ctx.notes.append(f"mmq path off: {mmq_off}")
        ctx.mmq_off_reason = mmq_off  # type: ignore[attr-defined]  (proposed LoadContext field)
    offence = None
    for w in weights:  # registration; the plane-only flag is cleared as the weights arrive
        offence = offence or plane_offence(w)
        if register:
            call_each(pm, "minfer_register_weight", only=usable, weight=w, ctx=ctx)
    model_mode, model_reason = fuse_ladder(ctx.gates, "", offence, readers)
    mode, reason = fuse_ladder(ctx.gates, mmq_off, offence, readers)
    ctx.fuse_mode = mode

    plan = Plan({}, {}, {}, {}, mode, reason, False, None, mmq_off, model_fuse_mode=model_mode,
                model_fuse_reason=model_reason, applicable=applicable,
                tensors={w.name: (tensor_class(w), QT(w.qtype).name.lower()) for w in weights})
    # 3. one matmul kernel per (phase, tensor), ranked by the policy
    for phase in PHASES:
        order = ranking(policy, phase, backend)
        for w in weights:
            offers = call_each(pm, "minfer_matmul_candidates", only=usable, weight=w, phase=phase, ctx=ctx)
            what = f"{phase} {w.name} ({QT(w.qtype).name} {w.n_out}x{w.n_in})"
            getattr(plan, phase)[w.name] = _choose(offers, order, what, log, plan.notes)

    # 4. mode 2 needs every chosen prefill consumer to read the plane; then the plugins' veto
    plane_readers = [n for n, c in plan.prefill.items() if "plane" in c.reads]
    if mode and not plane_readers:
        mode, reason = 0, "no chosen prefill kernel reads the activation plane"
    elif mode == 2:
        f32 = next((n for n, c in plan.prefill.items() if "plane" not in c.reads), None)
        if f32:
            c = plan.prefill[f32]
            mode, reason = 1, f"mode 2 degraded to 1: {f32} runs {c.label} ({c.plugin}), which reads the f32 activation"
    if mode:
        for name, res in call_each(pm, "minfer_fuse_mode", only=usable, model=model, requested=mode, ctx=ctx):
            if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[0], int)):
                raise UserError(f"plugin '{name}': minfer_fuse_mode must return None or (mode, reason), got {res!r}")
            if res[0] < mode:
                mode, reason = max(res[0], 0), f"{name}: {res[1]}"
    # 5. producers (fused ones only under mode 1/2; the prepass wherever a consumer reads the plane)
    ctx.fuse_mode = mode
    if mode:
        for kind in PRODUCERS:
            offers = call_each(pm, "minfer_producer_candidates", only=usable, kind=kind, ctx=ctx)
            c = _choose(offers, ranking(policy, "producer", backend), f"producer {kind}", log, plan.notes, required=False)
            if c:
                plan.producers[kind] = c
            else:
                plan.notes.append(f"no plugin offers a fused {kind}: it stays plain (f32 + prepass)")
        if not plan.producers:
            mode, reason = 0, "no plugin offers fused producers"
            ctx.fuse_mode = 0
    plan.a_transpose = bool(ctx.gates[TRANSPOSE_GATE] and plane_readers)
    if plan.a_transpose:
        offers = call_each(pm, "minfer_producer_candidates", only=usable, kind=PREPASS, ctx=ctx)
        plan.producers[PREPASS] = _choose(offers, ranking(policy, "producer", backend), "producer prepass", log,
                                          plan.notes, required=False) or Candidate(BUILTIN, "ref.prepass", torch_prepass)
    elif plane_readers:  # A_TRANSPOSE off: consumers convert; they must not demand a plane
        plan.notes.append(f"{TRANSPOSE_GATE} off but {plane_readers[0]} reads the plane: the plugin must convert itself")
    plan.fuse_mode, plan.fuse_reason = mode, reason

    # 6. raw bytes that no chosen kernel reads any more (planes replace them) are released
    plan.released_raw = release_raw(weights, plan)

    # 7. attention and the decode-step wrapper
    for phase in ATTENTION_PHASES:
        offers = call_each(pm, "minfer_attention_candidates", only=usable, phase=phase, ctx=ctx)
        plan.attention[phase] = _choose(offers, ranking(policy, "attention", backend), f"attention {phase}", log, plan.notes)
    for kind in DECODE_OPS:  # ranked like decode matmuls; the reference offers torch versions
        offers = call_each(pm, "minfer_producer_candidates", only=usable, kind=kind, ctx=ctx)
        plan.decode_ops[kind] = _choose(offers, ranking(policy, "decode", backend), f"producer {kind}", log, plan.notes)
    for kind in PREFILL_OPS:
        offers = call_each(pm, "minfer_producer_candidates", only=usable, kind=kind, ctx=ctx)
        plan.prefill_ops[kind] = _choose(offers, ranking(policy, "prefill", backend), f"producer {kind}", log, plan.notes)
    for work in STEPS:
        hook = getattr(pm.hook, f"minfer_wrap_{work}")
        wrappers = {impl.plugin_name: impl.function for impl in hook.get_hookimpls()}
        order = [n for n in ranking(policy, work, backend, last_resort=False) if n in wrappers and n in usable]
        setattr(plan, f"{work}_order", order)
        if order:
            setattr(plan, work, Candidate(order[0], f"{order[0]}.{work}", wrappers[order[0]]))
    log(f"fuse mode {plan.fuse_mode}" + (f" ({plan.fuse_reason})" if plan.fuse_reason else "")
        + f"; a_transpose {plan.a_transpose}; decode step: {plan.decode_step_order or 'plain'}"
        + f"; prefill step: {plan.prefill_step_order or 'plain'}")
    return plan


def release_raw(weights: list[Weight], plan: Plan) -> int:
    """Drop ``weight.raw`` where neither chosen kernel (prefill, decode) reads it; bytes freed."""
    freed = 0
    for w in weights:
        if w.raw is not None and not any(getattr(plan, ph)[w.name].reads_raw for ph in PHASES):
            freed += w.raw.numel() * w.raw.element_size()
            w.drop_raw()
    return freed


def wrap_step(work: str, step: Callable, ctx: LoadContext, pm, plan: Plan) -> Optional[Callable]:
    """``step`` as the first plugin in the plan's ``<work>_order`` wraps it; None if nobody does.

    ``work`` is ``"decode_step"`` or ``"prefill_step"`` (hooks ``minfer_wrap_<work>``)."""
    for name in getattr(plan, f"{work}_order"):
        for _, wrapped in call_each(pm, f"minfer_wrap_{work}", only=[name], step=step, ctx=ctx):
            getattr(pm, "log", lambda m: None)(f"{work.replace('_', ' ')} wrapped by {name}")
            return wrapped
    return None


def wrap_decode_step(step: Callable, ctx: LoadContext, pm, policy, plan: Plan, backend: Optional[str] = None) -> Callable:
    """The decode step as the first plugin in the plan's ``decode_step`` order wraps it (or as is)."""
    return wrap_step("decode_step", step, ctx, pm, plan) or step


def torch_prepass(x: torch.Tensor) -> Activation:
    """The core's stand-in prepass: the f32 rows and their bf16 plane."""
    return Activation(x, x.to(torch.bfloat16))


def check_backend(pm, ctx: LoadContext, backend: Optional[str]) -> None:
    """Raise :class:`BackendError` now if ``--backend`` cannot run here (call it before loading weights)."""
    if backend:
        _applicability(pm, ctx, backend)


def _applicability(pm, ctx: LoadContext, backend: Optional[str]) -> dict[str, Optional[str]]:
    reasons: dict[str, Optional[str]] = {n: None for n, p in pm.list_name_plugin() if p is not None}
    for name, why in call_each(pm, "minfer_applicable", only=[n for n in reasons if n != BUILTIN], ctx=ctx):
        reasons[name] = str(why)
    if backend and backend != BUILTIN:
        why = reasons.get(backend, "")
        if backend not in reasons:
            why = _absent(pm, backend)
        if why is not None:
            raise BackendError(f"backend '{backend}' cannot run here: {why}")
    return reasons


def _absent(pm, name: str) -> str:
    if pm.is_blocked(name):
        return f"blocked ({getattr(pm, 'blocked_names', {}).get(name, 'blocked')})"
    if name in PROJECT_PLUGINS:
        return f"not installed (pip install -e plugins/{name})"
    return "no such plugin installed"


def _choose(offers: Iterable[tuple[str, Any]], order: list[str], what: str, log, notes: list[str],
            required: bool = True) -> Optional[Candidate]:
    ranked: list[Candidate] = []
    for plugin, cands in offers:
        for c in cands if isinstance(cands, (list, tuple)) else [cands]:
            if not isinstance(c, Candidate) or c.plugin != plugin:
                raise UserError(f"plugin '{plugin}' offered {c!r} for {what}: expected Candidates naming '{plugin}'")
            if plugin in order:
                ranked.append(c)
            elif not any(f"'{plugin}'" in n for n in notes):
                notes.append(f"plugin '{plugin}' offers kernels but the policy does not place it (e.g. {what})")
    ranked.sort(key=lambda c: order.index(c.plugin))  # stable: a plugin's own order is kept
    if not ranked:
        if required:
            raise UserError(f"no kernel for {what}: no plugin in the order {order} offers one")
        return None
    log(f"{what}: " + " > ".join(f"{c.plugin}:{c.label}" for c in ranked) + f"  => {ranked[0].label}")
    return ranked[0]
