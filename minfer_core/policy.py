"""The gate policy: ``configs/gates.yaml`` (or ``--policy FILE`` / ``MINFER_POLICY``), validated.

The file orders, for each class of work, the plugins whose candidates win, and places gates:
``gates.<plugin>.<NAME>: value`` changes the default of a gate that plugin declares (hook
``minfer_gates``). Validation is strict: any problem is one :class:`PolicyError` reading
``"<file>: <key>: <problem>"``; the gate entries are checked against the declarations when the
gates are resolved (:meth:`Policy.check_gates`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Union

from .errors import UserError
from .gates import NAME_RE
from .strict_yaml import YamlRefusal, read_strict

#: Classes of work the policy orders, in the order ``minfer gates`` shows them.
WORK = ("prefill", "decode", "producer", "attention", "decode_step", "prefill_step", "batch_step")
OPTIONAL_WORK = ("prefill_step", "batch_step")  # may be left out of a policy file (then: nobody)
ENV_POLICY = "MINFER_POLICY"
_PKG = Path(__file__).resolve().parent
DEFAULT_PATHS = (_PKG.parent / "configs" / "gates.yaml", _PKG / "gates.yaml")


class PolicyError(UserError):
    """A policy file that cannot be used: ``"<file>: <key>: <problem>"``."""

    def __init__(self, path: Union[str, Path], key: str, problem: str):
        self.path, self.key, self.problem = str(path), key, problem
        super().__init__(f"{path}: {key}: {problem}")


@dataclass
class Policy:
    path: Path
    defaults: dict[str, dict[str, Union[bool, int]]]  # plugin -> gate -> the value the file gives
    order: dict[str, list[str]]

    def plugins(self) -> set[str]:
        """Every plugin the policy names."""
        return {p for ps in self.order.values() for p in ps} | set(self.defaults)

    def check_gates(self, gates: Mapping[str, Any], loaded: set[str]) -> None:
        """Check ``gates.<plugin>.<NAME>`` entries against what the loaded plugins declare (a
        plugin not loaded here cannot be checked; its entries are not in force)."""
        for plugin, entries in self.defaults.items():
            if plugin not in loaded:
                continue
            for name, value in entries.items():
                key = f"gates.{plugin}.{name}"
                gate = gates.get(name)
                if gate is None or gate.plugin != plugin:
                    own = sorted(g.name for g in gates.values() if g.plugin == plugin)
                    hint = (f"belongs under gates.{gate.plugin}" if gate is not None else
                            f"unknown gate ({plugin} declares: {', '.join(own) or 'none'})")
                    raise PolicyError(self.path, key, hint)
                if gate.kind == "switch" and type(value) is not bool:
                    raise PolicyError(self.path, key, f"expected on or off, got {value!r}")
                if gate.kind == "mode" and (type(value) is not int or value not in gate.modes):
                    modes = sorted(gate.modes)
                    want = ", ".join(map(str, modes[:-1])) + f" or {modes[-1]}"
                    raise PolicyError(self.path, key, f"expected a mode {want}, got {value!r}")


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
        top = self.mapping(data, "", ("version", "order"), ("gates",))
        if type(top["version"]) is not int or top["version"] != 1:
            self.fail("version", f"unsupported version {top['version']!r} (expected 1)")
        defaults: dict[str, dict[str, Union[bool, int]]] = {}
        for plugin, entries in self.mapping(top.get("gates") or {}, "gates", None).items():
            key = f"gates.{plugin}"
            if not isinstance(plugin, str) or plugin not in self.known:
                self.fail(key, f"unknown plugin '{plugin}' (known: {', '.join(sorted(self.known))})")
            entries = self.mapping(entries, key, None)
            for name, value in entries.items():
                if not isinstance(name, str) or not NAME_RE.match(name):
                    self.fail(f"{key}.{name}", "expected a gate name MINFER_...")
                if type(value) not in (bool, int):  # exactly: on/off or an integer mode, never 1.0 or "2"
                    self.fail(f"{key}.{name}", f"expected on, off or an integer mode, got {value!r}")
            defaults[plugin] = dict(entries)
        required = [w for w in WORK if w not in OPTIONAL_WORK]
        order = self.mapping(top["order"], "order", required, OPTIONAL_WORK)
        return Policy(self.path, defaults, {w: self.names(order.get(w), f"order.{w}") for w in WORK})


def _kind(v: Any) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, (dict, list)):
        return type(v).__name__
    return f"{type(v).__name__} {v!r}"
