"""``minfer plugins``: each plugin's name, version, hooks and origin (blocked ones too)."""

from __future__ import annotations

import json
from dataclasses import asdict

from ..cli import blocked_plugins
from ..plugins import get_plugin_manager, plugin_table

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("plugins", help="list the plugins found, their versions and hooks",
                       description="List the built-in reference backend and every plugin installed in the entry "
                                   "point group minfer.plugins: name, version, hooks, origin. Blocked plugins "
                                   "(-p no:NAME, MINFER_LOAD_PLUGINS) are listed as such.")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    return p


def run(args) -> int:
    pm = get_plugin_manager(blocked=blocked_plugins(args), trace=getattr(args, "trace_plugins", False))
    table = plugin_table(pm)
    if args.json:
        print(json.dumps([asdict(p) for p in table], indent=2))
        return 0
    for p in table:
        print(f"{p.name} {p.version}  {p.source}")
        for h in p.hooks:
            print(f"  {h}")
    return 0
