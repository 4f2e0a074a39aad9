"""``minfer gates``: each gate's value, source and effect; with ``-m``, what a model resolves to.

With a model only the tensor table is read (layout templates, ``.gguf.xz`` included, work): the
fuse mode the model allows and why, what is in force on this machine and why, and the kernel
label chosen for each class of tensor.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np

from ..cli import blocked_plugins
from ..dispatch import build_plan, check_backend, make_context, ranking
from ..gates import declared_gates, resolve_gates
from ..gguf_file import GGUFFile, ModelFileError, TensorEntry, map_file, parse_header
from ..plugins import get_plugin_manager
from ..policy import WORK, load_policy
from ..quants import QUANTS

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("gates", help="show the gates in force, where each value comes from and what it does",
                       description="Show each gate the plugins declare: its value, its source (default / yaml / "
                                   "env) and its effect. With -m, also the fuse mode the model resolves to (and why) and the "
                                   "kernel chosen for each class of tensor. Reads no tensor data.")
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file (or layout template, .gguf.xz too) or known model name")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    policy = load_policy(getattr(args, "policy", None))
    pm = get_plugin_manager(blocked=blocked_plugins(args), trace=getattr(args, "trace_plugins", False))
    gates = declared_gates(pm)
    loaded = {n for n, p in pm.list_name_plugin() if p is not None}
    backend = getattr(args, "backend", None)
    order = dict(policy.order)
    if backend:  # --backend: an error if it cannot run here; the order it gives
        from ..engine import pick_device

        check_backend(pm, make_context(pick_device(getattr(args, "device", None)), policy, gates=gates), backend)
        for work in order:
            wraps = [i.plugin_name for i in getattr(pm.hook, f"minfer_wrap_{work}").get_hookimpls()] \
                if work.endswith("_step") else [backend]
            order[work] = ranking(policy, work, backend if backend in wraps else None, last_resort=False)
    report = {
        "policy": str(policy.path),
        "gates": [{"name": g.name, "plugin": g.gate.plugin, "group": g.gate.group, "kind": g.gate.kind,
                   "value": g.value, "source": g.source, "raw": g.raw, "effect": g.effect,
                   "labels": list(g.gate.labels)}
                  for g in resolve_gates(policy, gates, loaded=loaded).values()],
        "order": order,
        "backend": backend,
    }
    if args.model:
        report["model"] = model_report(args, policy, pm, gates)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def model_report(args, policy, pm, gates) -> dict:
    from ..model_config import config_from_gguf
    from ..engine import pick_device
    from ..fetch import resolve_model
    from ..loader import weights_from_file

    path = resolve_model(args.model)
    f = open_header(path)
    cfg = config_from_gguf(f)
    weights = weights_from_file(f, cfg, None)
    device = pick_device(getattr(args, "device", None))
    ctx = make_context(device, policy, gates=gates)
    plan = build_plan(weights, ctx, pm, policy, getattr(args, "backend", None), register=False)
    return {
        "path": str(path), "arch": cfg.arch, "layers": cfg.n_layers, "matmul_weights": len(weights),
        "device": str(device), "compute_capability": list(ctx.compute_capability) if ctx.compute_capability else None,
        "model_fuse_mode": plan.model_fuse_mode, "model_fuse_reason": plan.model_fuse_reason,
        "fuse_mode": plan.fuse_mode, "fuse_reason": plan.fuse_reason, "fuse_plugin": plan.fuse.proposer,
        "fuse_off_reason": plan.fuse.off_reason, "a_transpose": plan.a_transpose,
        "plugins": {n: ("ok" if why is None else why) for n, why in plan.applicable.items()},
        "kernels": plan.labels_by_class(), "notes": plan.notes,
    }


def open_header(path) -> GGUFFile:
    """A GGUF file's metadata and tensor table; ``TensorEntry.data`` holds no bytes (zeros)."""
    path = Path(path)
    if path.name.endswith(".xz"):
        from ..synth import read_template

        _, header = read_template(path)
    else:
        with map_file(path, mmap.ACCESS_READ) as mm:
            header = parse_header(mm, path)
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(path, "missing metadata key 'general.architecture'")
    tensors = {t.name: TensorEntry(t.name, t.qtype, t.shape, _no_data(t)) for t in header.tensors}
    return GGUFFile(path, header.metadata, arch, tensors, header)


def _no_data(t) -> np.ndarray:
    """A read-only zero-stride stand-in with the tensor's byte shape (``nbytes`` right, no memory)."""
    row_bytes = QUANTS[t.qtype].row_bytes(t.ne[0])
    return np.broadcast_to(np.zeros((), np.uint8), tuple(t.shape[:-1]) + (row_bytes,))


def render(r: dict) -> str:
    lines = [f"policy: {r['policy']}", "", f"{'gate':<24} {'value':<5} {'source':<8} effect"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for g in r["gates"]:
        groups.setdefault((g["plugin"], g["group"]), []).append(g)
    for (plugin, group), gs in groups.items():
        lines.append(f"-- {plugin}, {group.replace('_', ' ')}")
        for g in gs:
            value = ("on" if g["value"] else "off") if isinstance(g["value"], bool) else str(g["value"])
            src = g["source"] + (f" ({g['raw']!r})" if g["source"] == "env" else "")
            lines.append(f"{g['name']:<24} {value:<5} {src:<8} {g['effect']}")
    lines += ["", "order (best first; reference is always the last resort)"
              + (f", --backend {r['backend']} first:" if r.get("backend") else ":")]
    lines += [f"  {w:<12} {' > '.join(r['order'][w]) or '-'}" for w in WORK]
    m = r.get("model")
    if m:
        lines += ["", f"model: {m['path']} ({m['arch']}, {m['layers']} layers, {m['matmul_weights']} matmul weights)",
                  f"  the model allows fuse mode {m['model_fuse_mode']}" + _why(m["model_fuse_reason"]),
                  f"  here ({m['device']}): fuse mode {m['fuse_mode']}" + _why(m["fuse_reason"]),
                  f"  fused producers: {m['fuse_plugin'] or 'none offered'}"
                  + (f" (off: {m['fuse_off_reason']})" if m["fuse_off_reason"] else ""),
                  "  plugins: " + "; ".join(f"{n} {s}" for n, s in m["plugins"].items())]
        k = m["kernels"]
        for phase in ("prefill", "decode", "batch"):
            if phase == "batch" and not k.get("batch"):
                lines.append("  batch kernels: none (the batched step runs every weight over row tiles)")
                continue
            lines.append(f"  {phase} kernels:")
            lines += [f"    {row['class']:<10} {row['qtype']:<5} x{row['tensors']:<4} {row['label']}  ({row['plugin']})"
                      for row in k[phase]]
            if phase == "decode":
                lines += [f"    {g['classes']:<10} x{g['groups']:<4} {g['label']}  ({g['plugin']}, one launch a group)"
                          for g in k["decode_groups"]]
        lines.append("  producers: " + (", ".join(f"{a} {b}" for a, b in k["producers"].items()) or "plain"))
        lines.append("  attention: " + ", ".join(f"{a} {b}" for a, b in k["attention"].items()))
        lines.append(f"  decode step: {k['decode_step'] or 'plain (not wrapped)'}")
        lines.append(f"  prefill step: {k['prefill_step'] or 'plain (not wrapped)'}")
        lines.append(f"  batch step: {k['batch_step'] or 'plain (not wrapped)'}")
        lines += [f"  note: {n}" for n in m["notes"]]
    return "\n".join(lines)


def _why(reason: str) -> str:
    return f" ({reason})" if reason else ""
