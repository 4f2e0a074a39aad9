"""The six MMQ gates and two plane builders: the one place ``MINFER_MMQ*`` variables are read.

Semantics (DESIGN.md, "The six gates"): an on/off gate that is unset, or set to anything other
than ``"0"``, is ON; ``"0"`` is OFF. ``MINFER_MMQ_A_FUSE`` is a mode: unset = the default (2),
``"1"`` = 1, ``"2"`` = 2, anything else = 0. The policy file supplies the default a gate takes
when its variable is unset; the environment overrides it. Everything is read once, at load
(:func:`resolve_gates`); forward passes only see the resolved values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Union

if TYPE_CHECKING:  # pragma: no cover
    from .policy import Policy

GATES = (
    "MINFER_MMQ",
    "MINFER_MMQ_RAW",
    "MINFER_MMQ_RAW_NB",
    "MINFER_MMQ_A_TRANSPOSE",
    "MINFER_MMQ_Q6K_NB",
    "MINFER_MMQ_A_FUSE",
)
PLANE_BUILDERS = ("MINFER_MMQ_Q6K_EXP", "MINFER_MMQ_Q4K_DSC")
ALL_GATES = GATES + PLANE_BUILDERS
FUSE_GATE = "MINFER_MMQ_A_FUSE"
FUSE_MODES = (0, 1, 2)

#: The verified-best values, in force when neither the policy nor the environment says otherwise.
BUILTIN_DEFAULTS: dict[str, Union[bool, int]] = {g: True for g in ALL_GATES} | {FUSE_GATE: 2}

#: The gates fuse modes 1 and 2 need on (with the mmq path applicable), as in the seed.
FUSE_REQUIRES = ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE", "MINFER_MMQ_Q6K_NB")


def read_gate(name: str, env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The raw value of a gate variable, or ``None`` when unset. Every gate read goes through here."""
    if name not in ALL_GATES:
        raise KeyError(f"unknown gate {name}")
    return env.get(name)


def gate_on(name: str, env: Mapping[str, str] = os.environ, default: bool = True) -> bool:
    """An on/off gate: unset -> ``default``; ``"0"`` -> off; any other value -> on."""
    if name == FUSE_GATE:
        raise KeyError(f"{FUSE_GATE} is a mode, not a switch: use fuse_mode_requested()")
    return switch_value(read_gate(name, env), default)


def fuse_mode_requested(env: Mapping[str, str] = os.environ, default: int = 2) -> int:
    """``MINFER_MMQ_A_FUSE``: unset -> ``default``; ``"1"`` -> 1; ``"2"`` -> 2; anything else -> 0."""
    return fuse_value(read_gate(FUSE_GATE, env), default)


def switch_value(raw: Optional[str], default: bool = True) -> bool:
    """The on/off meaning of a raw value (``None`` = unset)."""
    return default if raw is None else raw != "0"


def fuse_value(raw: Optional[str], default: int = 2) -> int:
    """The fuse-mode meaning of a raw value (``None`` = unset)."""
    return default if raw is None else {"1": 1, "2": 2}.get(raw, 0)


@dataclass
class GateValue:
    """A resolved gate. ``source``: ``default`` (the built-in value), ``yaml`` (the policy file
    changed it) or ``env`` (the variable is set; ``raw`` holds its text)."""

    name: str
    value: Union[bool, int]
    source: str
    raw: Optional[str]
    effect: str

    def shown(self) -> str:
        """The value as a person reads it: ``on``/``off`` or the fuse mode."""
        if isinstance(self.value, bool):
            return "on" if self.value else "off"
        return str(self.value)


def resolve_gates(policy: "Policy", env: Mapping[str, str] = os.environ) -> dict[str, GateValue]:
    """Resolve all eight gates once: the policy's defaults, overridden by the environment."""
    out: dict[str, GateValue] = {}
    for name in ALL_GATES:
        spec = policy.gates[name]
        raw = read_gate(name, env)
        parse = fuse_value if name == FUSE_GATE else switch_value
        value: Union[bool, int] = parse(raw, spec.default)
        if raw is not None:
            source = "env"
        else:
            source = "default" if value == BUILTIN_DEFAULTS[name] else "yaml"
        out[name] = GateValue(name, value, source, raw, spec.effect(value))
    return out


def gate_values(resolved: Mapping[str, GateValue]) -> dict[str, Union[bool, int]]:
    """Just the values (what :class:`~minfer_core.weights.LoadContext` carries)."""
    return {name: g.value for name, g in resolved.items()}
