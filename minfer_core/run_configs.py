"""Named run configurations for A/B commands (``bench --gates``, ``parity``).

A configuration is ``default`` or comma-separated ``KEY=VALUE`` items: ``MINFER_*`` keys are
environment overrides applied only while the engine loads (gates are resolved once, at load), and
``backend=NAME`` / ``plugin=no:NAME`` choose plugins.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

from .errors import UserError


def sweep(gates) -> tuple[str, ...]:
    """The sweep ``bench --gates`` runs: the default, each declared gate of group ``gate`` at "0",
    then each other non-zero, non-default mode of a mode gate."""
    main = [g for g in gates.values() if g.group == "gate"]
    modes = [f"{g.name}={m}" for g in main if g.kind == "mode" for m in sorted(g.modes) if m and m != g.default]
    return ("default",) + tuple(f"{g.name}=0" for g in main) + tuple(modes)


@dataclass
class RunConfig:
    label: str
    env: dict[str, str] = field(default_factory=dict)
    backend: str | None = None
    blocked: list[str] = field(default_factory=list)


def parse_config(spec: str) -> RunConfig:
    cfg = RunConfig(spec)
    if spec in ("", "default"):
        return cfg
    for item in spec.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise UserError(f"configuration '{spec}': expected KEY=VALUE, got '{item}'")
        if key.startswith("MINFER_"):
            cfg.env[key] = value
        elif key == "backend":
            cfg.backend = value
        elif key == "plugin" and value.startswith("no:"):
            cfg.blocked.append(value[3:])
        else:
            raise UserError(f"configuration '{spec}': unknown key '{key}' (MINFER_*, backend, plugin=no:NAME)")
    return cfg


@contextmanager
def applied(cfg: RunConfig):
    """Set the configuration's environment for the duration of a load, then restore it."""
    saved = {k: os.environ.get(k) for k in cfg.env}
    os.environ.update(cfg.env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_under(cfg: RunConfig, path, args, n_ctx: int):
    """Load the model under ``cfg`` plus the command's global plugin options (``--backend``, ...); a
    progress bar only on a terminal, as ``minfer run`` shows it."""
    from .cli import blocked_plugins
    from .engine import Engine

    with applied(cfg):
        return Engine.load(path, backend=cfg.backend or getattr(args, "backend", None),
                           policy=getattr(args, "policy", None), blocked=blocked_plugins(args) + cfg.blocked,
                           device=getattr(args, "device", None), n_ctx=n_ctx,
                           trace_plugins=getattr(args, "trace_plugins", False), progress=sys.stderr.isatty())
