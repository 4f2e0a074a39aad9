"""The gate policy: ``configs/gates.yaml`` (or ``--policy FILE`` / ``MINFER_POLICY``), validated.

The file gives each gate its default, what it does on and off, the plugins whose candidates it
enables and the label prefixes that prove it alive; and, for each class of work, the order in
which plugins' candidates are ranked. Validation is strict: any problem is one
:class:`PolicyError` reading ``"<file>: <key>: <problem>"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from .errors import UserError
from .strict_yaml import YamlRefusal, read_strict
from .gates import ALL_GATES, FUSE_GATE, FUSE_MODES, PLANE_BUILDERS

#: Classes of work the policy orders, in the order ``minfer gates`` shows them.
WORK = ("prefill", "decode", "producer", "attention", "decode_step", "prefill_step")
OPTIONAL_WORK = ("prefill_step",)  # may be left out of a policy file (then: nobody)
ENV_POLICY = "MINFER_POLICY"
_PKG = Path(__file__).resolve().parent
DEFAULT_PATHS = (_PKG.parent / "configs" / "gates.yaml", _PKG / "gates.yaml")


class PolicyError(UserError):
    """A policy file that cannot be used: ``"<file>: <key>: <problem>"``."""

    def __init__(self, path: Union[str, Path], key: str, problem: str):
        self.path, self.key, self.problem = str(path), key, problem
        super().__init__(f"{path}: {key}: {problem}")


@dataclass
class GateSpec:
    """One gate's entry in the policy."""

    name: str
    kind: str  # "gate" or "builder"
    default: Union[bool, int]
    description: str  # what ON (or, for the fuse gate, the gate as a whole) means
    off: str = ""  # what "0" means (switches)
    modes: dict[int, str] = field(default_factory=dict)  # fuse gate: mode -> meaning
    enables: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)

    def effect(self, value: Union[bool, int]) -> str:
        """What this value of the gate does."""
        if self.name == FUSE_GATE:
            return self.modes[int(value)]
        return self.description if value else self.off


@dataclass
class Policy:
    path: Path
    gates: dict[str, GateSpec]
    order: dict[str, list[str]]

    def plugins(self) -> set[str]:
        """Every plugin the policy names."""
        names = {p for ps in self.order.values() for p in ps}
        return names | {p for g in self.gates.values() for p in g.enables}


def default_policy_path() -> Path:
    for p in DEFAULT_PATHS:
        if p.is_file():
            return p
    raise UserError(f"no default policy: none of {', '.join(map(str, DEFAULT_PATHS))} exists")


def load_policy(path: Optional[Union[str, Path]] = None, known_plugins: Optional[Iterable[str]] = None,
                env=os.environ) -> Policy:
    """Load and validate a policy: ``path``, else ``$MINFER_POLICY``, else the shipped default.

    ``known_plugins``: the names a policy may use (default: the project's plugins, the built-in
    reference backend and every installed ``minfer.plugins`` entry point).
    """
    if path is None:
        path = env.get(ENV_POLICY) or default_policy_path()
    path = Path(path)
    if known_plugins is None:
        from .plugins import known_plugin_names

        known_plugins = known_plugin_names()
    try:
        data = read_strict(path)
    except (OSError, UnicodeDecodeError) as e:
        raise PolicyError(path, "file", f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    except YamlRefusal as e:
        raise PolicyError(path, e.key, e.problem) from None
    return _Validator(path, set(known_plugins)).policy(data)


class _Validator:
    def __init__(self, path: Path, known: set[str]):
        self.path, self.known = path, known

    def fail(self, key: str, problem: str):
        raise PolicyError(self.path, key, problem)

    def mapping(self, value: Any, key: str, required: Optional[Iterable[str]], optional: Iterable[str] = ()) -> dict:
        """A mapping with exactly the ``required`` keys (plus ``optional``); ``None``: any keys."""
        if not isinstance(value, dict):
            self.fail(key or "file", f"expected a mapping, got {_kind(value)}")
        if required is None:
            return value
        allowed = list(required) + list(optional)
        for k in value:
            if not any(k == a and type(k) is type(a) for a in allowed):  # exact: true is not 1
                self.fail(f"{key}.{k}" if key else str(k), f"unknown key (expected one of: {', '.join(map(str, allowed))})")
        for k in required:
            if k not in value:
                self.fail(f"{key}.{k}" if key else k, "missing")
        return value

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"expected a non-empty string, got {_kind(value)}")
        return " ".join(value.split())

    def names(self, value: Any, key: str, what: str = "plugin") -> list[str]:
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(key, f"expected a list of {what} names, got {_kind(value)}")
        seen = set()
        for v in value:
            if v in seen:
                self.fail(key, f"{what} '{v}' is listed twice")
            seen.add(v)
            if what == "plugin" and v not in self.known:
                self.fail(key, f"unknown plugin '{v}' (known: {', '.join(sorted(self.known))})")
        return list(value)

    def policy(self, data: Any) -> Policy:
        if data is None:
            self.fail("file", "empty policy")
        top = self.mapping(data, "", ("version", "gates", "plane_builders", "order"))
        if type(top["version"]) is not int or top["version"] != 1:
            self.fail("version", f"unsupported version {top['version']!r} (expected 1)")
        gates = {}
        for section, kind, names in (("gates", "gate", ALL_GATES[:6]), ("plane_builders", "builder", PLANE_BUILDERS)):
            entries = self.mapping(top[section], section, None)
            for name in entries:
                if name not in names:
                    other = "plane_builders" if name in PLANE_BUILDERS else "gates" if name in ALL_GATES else None
                    hint = f"belongs under {other}" if other else f"unknown gate (known: {', '.join(names)})"
                    self.fail(f"{section}.{name}", hint)
            for name in names:
                if name not in entries:
                    self.fail(f"{section}.{name}", "missing")
                gates[name] = self.gate(entries[name], f"{section}.{name}", name, kind)
        required = [w for w in WORK if w not in OPTIONAL_WORK]
        order = self.mapping(top["order"], "order", required, OPTIONAL_WORK)
        return Policy(self.path, gates, {w: self.names(order.get(w), f"order.{w}") for w in WORK})

    def gate(self, entry: Any, key: str, name: str, kind: str) -> GateSpec:
        common = ("default", "description", "enables", "labels")
        if name == FUSE_GATE:
            e = self.mapping(entry, key, common + ("modes",))
            d = e["default"]
            if type(d) is not int or d not in FUSE_MODES:  # exactly int: not 1.0, true or "2"
                self.fail(f"{key}.default", f"expected a fuse mode 0, 1 or 2, got {d!r}")
            modes = self.mapping(e["modes"], f"{key}.modes", FUSE_MODES)
            texts = {m: self.text(modes[m], f"{key}.modes.{m}") for m in FUSE_MODES}
            spec = GateSpec(name, kind, d, self.text(e["description"], f"{key}.description"), modes=texts)
        else:
            e = self.mapping(entry, key, common + ("when_off",))
            d = e["default"]
            if type(d) is not bool:
                self.fail(f"{key}.default", f"expected on or off, got {d!r}")
            spec = GateSpec(name, kind, d, self.text(e["description"], f"{key}.description"),
                            off=self.text(e["when_off"], f"{key}.when_off"))
        spec.enables = self.names(e["enables"], f"{key}.enables")
        spec.labels = self.names(e["labels"], f"{key}.labels", what="label prefix")
        if not spec.labels:
            self.fail(f"{key}.labels", "expected at least one label prefix (the proof the gate is alive)")
        return spec


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, (dict, list)):
        return type(v).__name__
    return f"{type(v).__name__} {v!r}"
