"""Plan building: every hook runs here, once, at load; the result is a table the forward reads.

:func:`make_context` resolves the gates the plugins declare, once. :func:`build_plan` runs named
steps in order: who can run here, registration, one matmul kernel per (phase, tensor), the fuse
negotiation, producers, raw bytes released, attention and fused single ops, step wrappers. Each
ranks what the plugins offer by the policy's order for its class of work (``--backend`` first),
the reference backend last.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from gguf import GGMLQuantizationType as QT

from .errors import UserError
from .gates import declared_gates, gate_values, resolve_gates
from .loader import input_groups
from .plan import PHASES, FuseChoice, Plan
from .plugins import BUILTIN, PluginError, bad_return, call_each, project_plugins
from .weights import Activation, Candidate, Gate, LoadContext, Weight

__all__ = ["Plan", "FuseChoice", "BackendError", "build_plan", "make_context", "ranking", "wrap_step",
           "wrap_decode_step", "check_backend", "release_raw", "tensor_class"]

#: paged_decode: one query row per entry of a batch; paged_prefill: a batch's prompt rows, by call
ATTENTION_PHASES = PHASES + ("paged_decode", "paged_prefill")
PRODUCERS = ("rmsnorm", "swiglu")  # fused under fuse mode 1/2: hooks minfer_<kind>_candidates
PREPASS = "prepass"
DECODE_OPS = ("decode_rmsnorm", "decode_rope_kv", "argmax", "embed")  # decode-side ops: the decode order, no gate
PREFILL_OPS = ("prefill_rope_kv",)  # multi-row fused ops: the prefill order, no gate
STEPS = ("decode_step", "prefill_step", "batch_step")  # whole steps a plugin may wrap (minfer_wrap_<step>)


class BackendError(UserError):
    """``--backend NAME`` names a plugin that cannot run here."""


def make_context(device, policy, env: Mapping[str, str] = os.environ, trace: bool = False,
                 gates: Optional[Mapping[str, Gate]] = None) -> LoadContext:
    """The load context: device, compute capability and the gates, resolved once from ``env``.

    ``gates``: the declared gates (:func:`~minfer_core.gates.declared_gates` of the run's plugin
    manager); ``None`` takes those of the installed plugins."""
    device = torch.device(device)
    cc = None
    if device.type == "cuda" and torch.cuda.is_available():
        cc = tuple(torch.cuda.get_device_capability(device))
    if gates is None:
        from .plugins import get_plugin_manager

        gates = declared_gates(get_plugin_manager())
    return LoadContext(device, cc, gate_values(resolve_gates(policy, gates, env)), trace=trace)


def ranking(policy, work: str, backend: Optional[str] = None, last_resort: bool = True) -> list[str]:
    """Plugins in the order they win ``work``: ``backend`` first, then the policy's, reference last."""
    order = [p for p in policy.order[work] if p != backend]
    if backend:
        order.insert(0, backend)
    if last_resort and BUILTIN not in order:
        order.append(BUILTIN)
    return order


def tensor_class(w: Weight) -> str:
    return w.role or re.sub(r"^blk\.\d+\.", "", w.name).removesuffix(".weight")


class _Asker:
    """Asks the usable plugins one hook and keeps the best offer by the policy's order for a work."""

    def __init__(self, pm, policy, ctx: LoadContext, backend: Optional[str], usable: list[str], notes: list[str]):
        self.pm, self.policy, self.ctx, self.backend = pm, policy, ctx, backend
        self.usable, self.notes = usable, notes
        self.log = getattr(pm, "log", lambda msg: None)

    def call(self, hook: str, **kwargs) -> list[tuple[str, Any]]:
        return call_each(self.pm, hook, only=self.usable, strict=[self.backend], ctx=self.ctx, **kwargs)

    def pick(self, hook: str, work: str, what: str, required: bool = True, **kwargs) -> Optional[Candidate]:
        return _choose(self.call(hook, **kwargs), ranking(self.policy, work, self.backend), what, self.log,
                       self.notes, hook, required)


def build_plan(weights: list[Weight], ctx: LoadContext, pm, policy, backend: Optional[str] = None, *,
               model: Any = None, readers: Sequence[str] = (), register: bool = True) -> Plan:
    """Resolve everything once. ``readers``: debug readers of f32 activations in force (they force
    mode 1). ``register=False`` plans without building anything (``minfer gates -m``)."""
    plan = Plan(applicable=_applicability(pm, ctx, backend),
                tensors={w.name: (tensor_class(w), QT(w.qtype).name.lower()) for w in weights})
    ctx.applicable = plan.applicable
    usable = [n for n, why in plan.applicable.items() if why is None]
    ask = _Asker(pm, policy, ctx, backend, usable, plan.notes)
    if register:
        register_weights(weights, ask, plan.applicable)
    choose_matmuls(weights, ask, plan)
    choose_groups(weights, ask, plan)
    plan.fuse = negotiate_fuse(weights, ask, plan, model, readers)
    choose_producers(ask, plan)
    plan.released_raw = release_raw(weights, plan)
    choose_attention_and_ops(ask, plan)
    choose_step_wrappers(ask, plan)
    ask.log(f"fuse mode {plan.fuse_mode}" + (f" ({plan.fuse_reason})" if plan.fuse_reason else "")
            + f"; a_transpose {plan.a_transpose}; decode step: {plan.decode_step_order or 'plain'}"
            + f"; prefill step: {plan.prefill_step_order or 'plain'}"
            + f"; batch step: {plan.batch_step_order or 'plain'}")
    plan.notes += getattr(pm, "failures", [])
    return plan


def register_weights(weights: list[Weight], ask: _Asker, applicable: dict) -> None:
    """``minfer_register_weight`` for every weight; a plugin whose hook raises leaves the load
    (its kernels may rely on what registration builds)."""
    for w in weights:
        failed: list[str] = []
        call_each(ask.pm, "minfer_register_weight", only=ask.usable, strict=[ask.backend], failed=failed,
                  weight=w, ctx=ask.ctx)
        for name in failed:
            applicable[name] = "its minfer_register_weight raised (see the warning)"
            ask.usable.remove(name)


def choose_matmuls(weights: list[Weight], ask: _Asker, plan: Plan) -> None:
    """One kernel per (phase, tensor), ranked by the policy's order for the phase; and, where a
    plugin offers one, the batched step's row-invariant kernel (ranked like decode)."""
    for phase in PHASES:
        for w in weights:
            what = f"{phase} {w.name} ({QT(w.qtype).name} {w.n_out}x{w.n_in})"
            getattr(plan, phase)[w.name] = ask.pick("minfer_matmul_candidates", phase, what, weight=w, phase=phase)
    for w in weights:
        what = f"batch {w.name} ({QT(w.qtype).name} {w.n_out}x{w.n_in})"
        c = ask.pick("minfer_batch_matmul_candidates", "decode", what, required=False, weight=w)
        if c is not None:
            plan.batch[w.name] = c


def choose_groups(weights: list[Weight], ask: _Asker, plan: Plan) -> None:
    """One decode kernel for each group of weights sharing an input (``loader.input_groups``), where the
    plugin that serves every member offers one (ranked like decode matmuls)."""
    for group in input_groups(weights):
        names = tuple(w.name for w in group)
        owners = {plan.decode[n].plugin for n in names}
        what = "decode " + " + ".join(names)
        c = ask.pick("minfer_matmul_group_candidates", "decode", what, required=False, weights=group, phase="decode")
        if c is not None and owners == {c.plugin}:
            plan.decode_groups[names] = c


def negotiate_fuse(weights: list[Weight], ask: _Asker, plan: Plan, model: Any, readers: Sequence[str]) -> FuseChoice:
    """The fuse mode, negotiated between what producers write and consumers read: the best proposal
    (what the model allows), 0 where its plugin cannot run, lowered to what the chosen prefill
    consumers read (mode 2 only if all read the plane), then the plugins' veto."""
    fuse = FuseChoice()
    order = ranking(ask.policy, "producer", ask.backend)
    proposals = []
    for name, res in call_each(ask.pm, "minfer_fuse_proposal", strict=[ask.backend], weights=weights,
                               readers=list(readers), ctx=ask.ctx):
        _check_fuse_answer(name, res, "minfer_fuse_proposal")
        proposals.append((res[0], -order.index(name) if name in order else -len(order), name, res[1]))
    if not proposals:
        fuse.model_reason = fuse.reason = "no plugin offers fused producers"
        return fuse
    fuse.model_mode, _, fuse.proposer, fuse.model_reason = max(proposals)
    mode, reason = fuse.model_mode, fuse.model_reason
    why = plan.applicable.get(fuse.proposer, "not loaded")
    if why is not None:
        fuse.off_reason = f"{fuse.proposer} cannot run here: {why}"
        mode, reason = 0, f"fused producers off: {fuse.off_reason}"
    plane_readers = [n for n, c in plan.prefill.items() if "plane" in c.reads]
    if mode and not plane_readers:
        mode, reason = 0, "no chosen prefill kernel reads the activation plane"
    elif mode == 2:
        f32 = next((n for n, c in plan.prefill.items() if "plane" not in c.reads), None)
        if f32:
            c = plan.prefill[f32]
            mode, reason = 1, f"mode 2 degraded to 1: {f32} runs {c.label} ({c.plugin}), which reads the f32 activation"
    if mode:
        for name, res in ask.call("minfer_fuse_mode", model=model, requested=mode):
            _check_fuse_answer(name, res, "minfer_fuse_mode")
            if res[0] < mode:
                mode, reason = max(res[0], 0), f"{name}: {res[1]}"
    fuse.mode, fuse.reason = mode, reason
    return fuse


def _check_fuse_answer(name: str, res: Any, hook: str) -> None:
    if not (isinstance(res, tuple) and len(res) == 2 and type(res[0]) is int and isinstance(res[1], str)):
        raise PluginError(f"plugin '{name}' hook {hook} must return None or (mode, reason), got {res!r}")


def choose_producers(ask: _Asker, plan: Plan) -> None:
    """Fused RMSNorm/SwiGLU under mode 1/2; the prepass wherever a chosen consumer reads the plane."""
    ask.ctx.fuse_mode = plan.fuse.mode
    if plan.fuse.mode:
        for kind in PRODUCERS:
            c = ask.pick(f"minfer_{kind}_candidates", "producer", f"producer {kind}", required=False)
            if c:
                plan.producers[kind] = c
            else:
                plan.notes.append(f"no plugin offers a fused {kind}: it stays plain (f32 + prepass)")
        if not plan.producers:
            plan.fuse.mode, plan.fuse.reason = 0, "no plugin offers fused producers"
            ask.ctx.fuse_mode = 0
    plan.a_transpose = any("plane" in c.reads for c in plan.prefill.values())
    if plan.a_transpose:
        plan.producers[PREPASS] = ask.pick("minfer_prepass_candidates", "producer", "producer prepass",
                                           required=False) or Candidate(BUILTIN, "ref.prepass", torch_prepass)


def choose_attention_and_ops(ask: _Asker, plan: Plan) -> None:
    for phase in ATTENTION_PHASES:
        plan.attention[phase] = ask.pick("minfer_attention_candidates", "attention", f"attention {phase}", phase=phase)
    for kind in DECODE_OPS:  # ranked like decode matmuls; the reference offers torch versions
        plan.decode_ops[kind] = ask.pick(f"minfer_{kind}_candidates", "decode", f"op {kind}")
    for kind in PREFILL_OPS:
        plan.prefill_ops[kind] = ask.pick(f"minfer_{kind}_candidates", "prefill", f"producer {kind}")


def choose_step_wrappers(ask: _Asker, plan: Plan) -> None:
    for work in STEPS:
        hook = getattr(ask.pm.hook, f"minfer_wrap_{work}")
        wrappers = {impl.plugin_name: impl.function for impl in hook.get_hookimpls()}
        order = [n for n in ranking(ask.policy, work, ask.backend, last_resort=False)
                 if n in wrappers and n in ask.usable]
        setattr(plan, f"{work}_order", order)
        if order:
            setattr(plan, work, Candidate(order[0], f"{order[0]}.{work}", wrappers[order[0]]))


def release_raw(weights: list[Weight], plan: Plan) -> int:
    """Drop ``weight.raw`` where no chosen kernel (prefill, decode, batch) reads it; bytes freed."""
    freed = 0
    for w in weights:
        chosen = [getattr(plan, ph)[w.name] for ph in PHASES] + ([plan.batch[w.name]] if w.name in plan.batch else [])
        if w.raw is not None and not any(c.reads_raw for c in chosen):
            freed += w.raw.numel() * w.raw.element_size()
            w.drop_raw()
    return freed


def wrap_step(work: str, step: Callable, ctx: LoadContext, pm, plan: Plan, **extra) -> Optional[Callable]:
    """``step`` as the first plugin in the plan's ``<work>_order`` wraps it; None if nobody does.

    ``work`` is one of :data:`STEPS` (hooks ``minfer_wrap_<work>``); ``extra``: the hook's further
    arguments (``padding`` for ``"batch_step"``)."""
    hook = f"minfer_wrap_{work}"
    for name in getattr(plan, f"{work}_order"):  # one that raises is passed over (a warning)
        for _, wrapped in call_each(pm, hook, only=[name], step=step, ctx=ctx, **extra):
            if not callable(wrapped):
                raise bad_return(name, hook, wrapped, "a callable with the step's signature, or None")
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
    failed: list[str] = []
    for name, why in call_each(pm, "minfer_applicable", only=[n for n in reasons if n != BUILTIN], strict=[backend],
                               failed=failed, ctx=ctx):
        if not isinstance(why, str) or not why.strip():
            raise bad_return(name, "minfer_applicable", why, "None (it can run here) or a reason string")
        reasons[name] = why
    for name in failed:
        reasons[name] = "its minfer_applicable raised (see the warning)"
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
    if name in project_plugins():
        return f"not installed (pip install -e plugins/{name})"
    return "no such plugin installed"


def _choose(offers: Iterable[tuple[str, Any]], order: list[str], what: str, log, notes: list[str], hook: str,
            required: bool = True) -> Optional[Candidate]:
    ranked: list[Candidate] = []
    for plugin, cands in offers:
        for c in cands if isinstance(cands, (list, tuple)) else [cands]:
            if not isinstance(c, Candidate) or c.plugin != plugin:
                raise PluginError(f"plugin '{plugin}' offered {c!r} for {what} (hook {hook}): expected Candidates "
                                  f"naming '{plugin}'")
            if not callable(c.fn) or not isinstance(c.label, str) or not c.label:
                bad = f"fn={c.fn!r}"[:60] if not callable(c.fn) else f"label={c.label!r}"[:60]
                raise PluginError(f"plugin '{plugin}' hook {hook} returned a Candidate for {what} with {bad}: "
                                  f"expected Candidates with a callable fn and a non-empty label; "
                                  f"block it with -p no:{plugin}")
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
