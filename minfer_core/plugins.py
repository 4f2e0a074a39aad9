"""The plugin manager: the built-in reference backend plus every ``minfer.plugins`` entry point.

Plugins are blocked with ``-p no:NAME`` (``blocked``) or limited by the allowlist
``MINFER_LOAD_PLUGINS=a,b`` (empty: no entry points at all). The reference backend is built in
and can be neither. A hook implementation with no specification, a ``minfer_*`` function
without ``@hookimpl`` and a plugin that fails to import are errors naming the plugin. The trace
switch (``--trace-plugins`` / ``MINFER_TRACE_PLUGINS=1``) prints, on stderr, every hook call
with what each plugin returned and, from :mod:`minfer_core.dispatch`, which candidate won.

A plugin that misbehaves at load is handled by kind (docs/plugins.md, "When a plugin fails"):

* a hook that **raises** leaves that plugin out of that decision (out of the whole load when it
  is ``minfer_register_weight`` or ``minfer_applicable``), with one warning on stderr naming the
  plugin and the hook; the policy's next plugin, and in the end the reference backend, serves the
  work. When ``--backend`` names the plugin, the same failure is an error (explicit requests
  fail loudly).
* a hook that **returns the wrong thing** (a reason that is not a string, a candidate without a
  callable, a wrapper that is not callable) is a :class:`PluginError` naming plugin and hook:
  such a plugin is written against another contract and would fail on every load.
* an entry point named ``reference`` is ignored with a warning: the built-in backend cannot be
  displaced, blocked or left out by ``MINFER_LOAD_PLUGINS``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable, Optional

import pluggy

from . import __version__, hookspecs
from .errors import UserError

GROUP = "minfer.plugins"
BUILTIN = "reference"
#: The project's own plugins: a policy may name them even where they are not installed.
ENV_ALLOW = "MINFER_LOAD_PLUGINS"
ENV_TRACE = "MINFER_TRACE_PLUGINS"
_FROM_ENV: Any = object()


class PluginError(UserError):
    """A plugin that cannot be loaded, blocked or trusted; the text names it."""


@dataclass
class PluginInfo:
    name: str
    version: str
    hooks: list[str] = field(default_factory=list)
    source: str = ""  # "built in", "<dist> (entry point <value>)" or "registered"
    blocked: bool = False


class MinferPluginManager(pluggy.PluginManager):
    """A pluggy manager that knows where each plugin came from and whether to trace."""

    def __init__(self, trace: bool = False):
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.trace_calls = trace
        self.sources: dict[str, tuple[str, str]] = {}  # name -> (version, source)
        self.blocked_names: dict[str, str] = {}  # name -> why ("-p no:NAME" / "MINFER_LOAD_PLUGINS")
        self.failures: list[str] = []  # one line per (plugin, hook) that raised during this load
        self._warned: set = set()

    def set_blocked(self, name: str) -> None:
        if name == BUILTIN:  # pluggy would unregister the built-in backend
            raise PluginError("the reference backend is built in and cannot be blocked")
        super().set_blocked(name)

    def register(self, plugin, name: Optional[str] = None):
        name = name or self.get_canonical_name(plugin)
        unmarked = [a for a in dir(plugin) if a.startswith("minfer_") and inspect.isroutine(getattr(plugin, a, None))
                    and not hasattr(getattr(plugin, a), f"{hookspecs.PROJECT}_impl")]
        if unmarked:
            raise PluginError(f"plugin '{name}': {unmarked[0]} is not marked @hookimpl (from minfer_core.hookspecs)")
        try:
            out = super().register(plugin, name)
        except pluggy.PluginValidationError as e:
            raise PluginError(f"plugin '{name}': {_one_line(e)}") from None
        except ValueError as e:  # already registered / name taken
            raise PluginError(f"plugin '{name}': {e}") from None
        for hook in self.get_hookcallers(plugin) or []:
            if not hook.has_spec():
                self.unregister(plugin)
                raise PluginError(f"plugin '{name}': unknown hook '{hook.name}' (no such hook specification; "
                                  f"see docs/plugins.md)")
        self.sources.setdefault(name, (str(getattr(plugin, "__version__", "-")), "registered"))
        return out

    def log(self, msg: str) -> None:
        if self.trace_calls:
            print(f"[minfer plugins] {msg}", file=sys.stderr, flush=True)

    def warn(self, msg: str, key: Any = None) -> None:
        """One warning on stderr per ``key`` (default: the message); kept in ``failures`` for the
        plan's notes."""
        key = msg if key is None else key
        if key not in self._warned:
            self._warned.add(key)
            self.failures.append(msg)
            print(f"minfer: warning: {msg}", file=sys.stderr, flush=True)


def installed_entry_points() -> dict[str, metadata.EntryPoint]:
    """Entry points of group ``minfer.plugins`` by name (the name is the plugin's name)."""
    out: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=GROUP):
        prev = out.get(ep.name)
        if prev is not None and prev.value != ep.value:
            raise PluginError(f"plugin '{ep.name}' is provided twice: {prev.value} and {ep.value}")
        out[ep.name] = ep
    return out


@functools.lru_cache(maxsize=1)
def project_plugins() -> frozenset[str]:
    """The plugins the shipped default policy places (known by name even when not installed)."""
    from .policy import default_policy_path
    from .strict_yaml import read_strict

    order = (read_strict(default_policy_path()) or {}).get("order") or {}
    return frozenset(n for names in order.values() for n in (names or []) if n != BUILTIN)


def known_plugin_names() -> set[str]:
    """Names a policy, ``--backend`` or ``-p no:NAME`` may use."""
    return {BUILTIN, *project_plugins(), *installed_entry_points()}


def _env_trace(env=os.environ) -> bool:
    return env.get(ENV_TRACE, "") not in ("", "0")


def get_plugin_manager(blocked: Iterable[str] = (), allow: Optional[str] = _FROM_ENV, trace: bool = False,
                       env=os.environ) -> MinferPluginManager:
    """A manager with the reference backend and every allowed, unblocked installed plugin.

    ``allow``: comma-separated allowlist (default ``$MINFER_LOAD_PLUGINS``; ``None``: no limit;
    ``""``: no entry points). ``trace`` (or ``$MINFER_TRACE_PLUGINS``) prints hook calls.
    """
    pm = MinferPluginManager(trace=trace or _env_trace(env))
    if allow is _FROM_ENV:
        allow = env.get(ENV_ALLOW)
    eps = installed_entry_points()
    known = {BUILTIN, *project_plugins(), *eps}
    blocked = list(dict.fromkeys(blocked))
    for name in blocked:
        if name == BUILTIN:
            raise PluginError("the reference backend is built in and cannot be blocked")
        if name not in known:
            raise PluginError(f"cannot block '{name}': no such plugin (known: {', '.join(sorted(known))})")
    allowed = None
    if allow is not None:
        allowed = {a.strip() for a in allow.split(",") if a.strip()} - {BUILTIN}
        missing = sorted(allowed - set(eps))
        if missing:
            raise PluginError(f"{ENV_ALLOW}: plugin '{missing[0]}' is not installed "
                              f"(installed: {', '.join(sorted(set(eps) - {BUILTIN})) or 'none'})")
    _register_reference(pm)
    for name, ep in sorted(eps.items()):
        if name == BUILTIN:  # the built-in backend cannot be displaced, blocked or left out
            pm.warn(f"entry point 'reference' ({ep.value}) ignored: 'reference' is the built-in backend's name; "
                    "rename the plugin")
            continue
        version = ep.dist.version if ep.dist else "?"
        source = f"{ep.dist.name if ep.dist else '?'} (entry point {ep.value})"
        why = "-p no:" + name if name in blocked else f"not in {ENV_ALLOW}" if allowed is not None and name not in allowed else ""
        if why:
            pm.set_blocked(name)
            pm.blocked_names[name] = why
            pm.sources[name] = (version, source)
            pm.log(f"{name}: blocked ({why})")
            continue
        try:
            obj = ep.load()
        except Exception as e:  # a broken installed plugin is an error, never silently skipped
            raise PluginError(f"plugin '{name}' ({ep.value}) cannot be loaded: {type(e).__name__}: {e}") from None
        pm.sources[name] = (version, source)
        pm.register(obj, name=name)
        pm.log(f"{name} {version}: loaded from {source}")
    for name in blocked:  # project plugins that are not installed: nothing to load, keep the record
        if not pm.is_blocked(name):
            pm.set_blocked(name)
            pm.blocked_names[name] = f"-p no:{name}"
    return pm


def _register_reference(pm: MinferPluginManager) -> None:
    try:
        from . import reference
    except ImportError as e:  # the lead's module may not exist yet in a partial checkout
        pm.log(f"reference: not available ({e})")
        return
    pm.sources[BUILTIN] = (__version__, "built in")
    pm.register(reference, name=BUILTIN)


def plugin_table(pm: pluggy.PluginManager) -> list[PluginInfo]:
    """Every plugin the manager knows, registered or blocked, sorted by name."""
    sources = getattr(pm, "sources", {})
    out = []
    for name, plugin in pm.list_name_plugin():
        version, source = sources.get(name, (str(getattr(plugin, "__version__", "-")), "registered"))
        if plugin is None:
            why = getattr(pm, "blocked_names", {}).get(name, "blocked")
            out.append(PluginInfo(name, version, [], f"blocked ({why})" + (f"; {source}" if name in sources else ""), True))
            continue
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        out.append(PluginInfo(name, version, hooks, source))
    return sorted(out, key=lambda p: (p.name != BUILTIN, p.name))


def plugin_versions(pm: pluggy.PluginManager) -> list[tuple[str, str, list[str]]]:
    """``(name, version, hooks)`` of each registered (not blocked) plugin."""
    return [(p.name, p.version, p.hooks) for p in plugin_table(pm) if not p.blocked]


def call_each(pm: pluggy.PluginManager, hook_name: str, only: Optional[Iterable[str]] = None,
              strict: Iterable[Optional[str]] = (), failed: Optional[list] = None, **kwargs) -> list[tuple[str, Any]]:
    """Call one hook on each plugin (or only those named), returning ``(plugin name, result)`` pairs
    for the implementations that returned something; each call is traced when tracing is on.

    An implementation that raises is left out of the result with a warning naming plugin and hook
    (:func:`hook_failure`), unless its plugin is in ``strict`` (the ``--backend``): then it is a
    :class:`PluginError`. The names of plugins that raised are appended to ``failed``.
    """
    names = None if only is None else set(only)
    strict = {s for s in strict if s}
    log = getattr(pm, "log", lambda msg: None)
    out = []
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        if names is not None and impl.plugin_name not in names:
            continue
        try:
            result = impl.function(*[kwargs[a] for a in impl.argnames])
        except Exception as e:  # a plugin's bug: name it, and let something else serve
            msg = hook_failure(impl.plugin_name, hook_name, e)
            if impl.plugin_name in strict:
                raise PluginError(msg) from e
            warn = getattr(pm, "warn", None)
            if warn is None:
                raise PluginError(msg) from e
            warn(f"{msg} (left out of this decision)", key=(impl.plugin_name, hook_name))
            if failed is not None:
                failed.append(impl.plugin_name)
            continue
        log(f"{hook_name}({_args(kwargs)}) {impl.plugin_name} -> {_short(result)}")
        if result is not None:
            out.append((impl.plugin_name, result))
    return out


def hook_failure(plugin: str, hook: str, e: BaseException) -> str:
    """``plugin 'foo' hook minfer_x raised ValueError: ...; block it with -p no:foo`` (one line)."""
    text = " ".join(str(e).split())
    if len(text) > 200:
        text = text[:197] + "..."
    how = "a bug in minfer's built-in backend" if plugin == BUILTIN else f"block it with -p no:{plugin}"
    return f"plugin '{plugin}' hook {hook} raised {type(e).__name__}: {text}; {how}"


def bad_return(plugin: str, hook: str, got: Any, expected: str) -> PluginError:
    """The error for a hook that returned something outside its contract."""
    how = "" if plugin == BUILTIN else f"; block it with -p no:{plugin}"
    return PluginError(f"plugin '{plugin}' hook {hook} returned {_short(got)}: expected {expected}{how}")


def _args(kwargs: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items() if k != "ctx")


def _short(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v) + "]"
    for attr in ("label", "name"):
        if isinstance(getattr(v, attr, None), str):
            return getattr(v, attr)
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _one_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Plugin "):  # pluggy repeats the plugin's name first
        lines = lines[1:]
    return "; ".join(lines)
