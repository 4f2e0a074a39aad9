"""One markdown table from ``ab_trees.sh``'s lines (``SIDE rR: TEST | t/s ± sd | TEST | ...``), on stdin.

    bash benchmarks/ab_trees.sh ... | tee ab.txt; python benchmarks/ab_table.py < ab.txt

A row per side and test: each round's t/s, their mean, the mean against the first side's (%), against
llama.cpp's mean when its side ("llama.cpp", ``LLAMA_BENCH``) ran, and for a test at depth (``tgN @ dX``)
the share of the same side's ``tgN``.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

LINE = re.compile(r"^(\S+) r(\d+): (.*)$")
CELL = re.compile(r"([a-z]+\d+(?: @ d\d+)?) \| ([\d.]+) ± [\d.]+ \|")


def parse(lines) -> dict:
    """{side: {test: [t/s of each round]}}, sides and tests in the order they first appear."""
    runs: dict = {}
    for ln in lines:
        m = LINE.match(ln.strip())
        if not m:
            continue
        tests = runs.setdefault(m.group(1), defaultdict(list))
        for test, ts in CELL.findall(m.group(3)):
            tests[test].append(float(ts))
    return runs


def table(runs: dict) -> list[str]:
    mean = {s: {t: sum(v) / len(v) for t, v in tests.items()} for s, tests in runs.items()}
    llama = mean.get("llama.cpp", {})
    sides = [s for s in runs if s != "llama.cpp"]
    first = mean[sides[0]] if sides else {}
    out = ["| side | test | rounds (t/s) | mean | vs " + (sides[0] if sides else "-") + " | vs llama.cpp | of tgN |",
           "|---|---|---|---:|---:|---:|---:|"]
    for s in sides + (["llama.cpp"] if llama else []):
        for t, vals in runs[s].items():
            m = mean[s][t]
            base = f"{100 * (m / first[t] - 1):+.2f}%" if t in first and s != "llama.cpp" else "-"
            ref = f"{m / llama[t]:.3f}x" if t in llama and s != "llama.cpp" else "-"
            d0 = t.split(" @ ")[0]
            share = f"{100 * m / mean[s][d0]:.1f}%" if " @ " in t and d0 in mean[s] else "-"
            out.append(f"| {s} | {t} | {', '.join(f'{v:.2f}' for v in vals)} | {m:.2f} | {base} | {ref} | {share} |")
    return out


if __name__ == "__main__":
    print("\n".join(table(parse(sys.stdin))))
