"""Gates: switches and modes that plugins declare (hook ``minfer_gates``), resolved once per load.

The core knows no gate by name. Each plugin declares its own as :class:`~minfer_core.weights.Gate`
data; the policy (``gates.<plugin>.<NAME>: value``) may change a default; the environment variable
of the same name overrides both. Semantics (DESIGN.md, "The six gates"): a switch that is unset,
or set to anything but ``"0"``, is ON, and ``"0"`` is OFF; a mode takes ``str(mode)`` for each of
its modes and 0 for anything else. :func:`read_gate` is the one place a gate variable is read,
and :func:`resolve_gates` reads each declared gate exactly once, at load; forward passes only see
the resolved values.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Union

from .weights import Gate

if TYPE_CHECKING:  # pragma: no cover
    from .policy import Policy

NAME_RE = re.compile(r"^MINFER_[A-Z0-9_]+$")
HOOK = "minfer_gates"


def read_gate(name: str, gates: Mapping[str, Gate], env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The raw value of a declared gate's variable, or ``None`` when unset. Every gate read goes
    through here; an undeclared name is a ``KeyError``."""
    if name not in gates:
        raise KeyError(f"unknown gate {name} (declared: {', '.join(sorted(gates)) or 'none'})")
    return env.get(name)


@dataclass
class GateValue:
    """A resolved gate. ``source``: ``default`` (the plugin's default is in force), ``yaml`` (the
    policy file changed it) or ``env`` (the variable is set; ``raw`` holds its text)."""

    name: str
    value: Union[bool, int]
    source: str
    raw: Optional[str]
    effect: str
    gate: Optional[Gate] = None

    def shown(self) -> str:
        """The value as a person reads it: ``on``/``off`` or the mode."""
        if isinstance(self.value, bool):
            return "on" if self.value else "off"
        return str(self.value)


def resolve_gates(policy: "Policy", gates: Mapping[str, Gate], env: Mapping[str, str] = os.environ,
                  loaded: Optional[Iterable[str]] = None) -> dict[str, GateValue]:
    """Resolve every declared gate once: plugin default, then the policy, then the environment.

    ``loaded``: the plugins whose declarations ``gates`` holds (default: their owners); the policy's
    entries for those are checked against the declarations (:meth:`Policy.check_gates`).
    """
    policy.check_gates(gates, set(loaded) if loaded is not None else {g.plugin for g in gates.values()})
    out: dict[str, GateValue] = {}
    for name, gate in gates.items():
        placed = policy.defaults.get(gate.plugin, {})
        default = placed.get(name, gate.default)
        raw = read_gate(name, gates, env)
        value = default if raw is None else gate.parse(raw)
        source = "env" if raw is not None else "default" if value == gate.default else "yaml"
        out[name] = GateValue(name, value, source, raw, gate.effect(value), gate)
    return out


def gate_values(resolved: Mapping[str, GateValue]) -> dict[str, Union[bool, int]]:
    """Just the values (what :class:`~minfer_core.weights.LoadContext` carries)."""
    return {name: g.value for name, g in resolved.items()}


def declared_gates(pm) -> dict[str, Gate]:
    """Every gate the registered plugins declare, by name, each checked (:func:`check_gate`).

    Called on every registered plugin, applicable here or not (a declaration is data). A gate
    declared twice, or a malformed declaration, is a :class:`~minfer_core.plugins.PluginError`;
    a plugin whose hook raises declares nothing (with a warning).
    """
    from .plugins import PluginError, bad_return, call_each

    out: dict[str, Gate] = {}
    for plugin, gates in call_each(pm, HOOK):
        if not isinstance(gates, (list, tuple)):
            raise bad_return(plugin, HOOK, gates, "a list of minfer_core.weights.Gate")
        for gate in gates:
            if not isinstance(gate, Gate):
                raise bad_return(plugin, HOOK, gate, "a list of minfer_core.weights.Gate")
            problem = check_gate(gate)
            if problem:
                raise PluginError(f"plugin '{plugin}' hook {HOOK}: gate {gate.name!r}: {problem}; "
                                  f"block it with -p no:{plugin}")
            if gate.name in out:
                raise PluginError(f"plugin '{plugin}' hook {HOOK}: gate {gate.name} is already declared by "
                                  f"'{out[gate.name].plugin}'; block one with -p no:{plugin}")
            gate.plugin = plugin
            out[gate.name] = gate
    return out


def check_gate(g: Gate) -> str:
    """What is wrong with a declaration, or ``""``."""
    if not isinstance(g.name, str) or not NAME_RE.match(g.name):
        return "the name must look like MINFER_SOMETHING (capitals, digits, underscores)"
    if not isinstance(g.description, str) or not g.description.strip():
        return "description: expected a non-empty string"
    if not isinstance(g.labels, (list, tuple)) or not all(isinstance(x, str) and x for x in g.labels):
        return "labels: expected a list of label prefixes"
    if not isinstance(g.group, str) or not g.group:
        return "group: expected a non-empty string"
    if g.kind == "switch":
        if type(g.default) is not bool:
            return f"default: a switch takes True or False, got {g.default!r}"
        if not isinstance(g.off, str) or not g.off.strip():
            return "off: a switch must say what \"0\" does"
        return ""
    if not all(type(m) is int and m >= 0 and isinstance(t, str) and t for m, t in g.modes.items()) or 0 not in g.modes:
        return "modes: expected {0: what off does, 1: ..., ...} (integers >= 0, 0 included, texts)"
    if type(g.default) is not int or g.default not in g.modes:
        return f"default: expected one of the modes {sorted(g.modes)}, got {g.default!r}"
    return ""
