"""benchmarks/ab_table.py: the table ab_trees.sh ends with, from its lines (figures worked out by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

path = Path(__file__).resolve().parents[1] / "benchmarks" / "ab_table.py"
spec = importlib.util.spec_from_file_location("ab_table", path)
ab_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_table)

LINES = """\
base: /tree/minfer_core/__init__.py /tree/plugins/mmq_triton/minfer_mmq_triton/__init__.py
base r1: tg128 | 500.00 ± 0.10 | tg128 @ d4096 | 450.00 ± 0.80 |
new r1: tg128 | 510.00 ± 0.20 | tg128 @ d4096 | 459.00 ± 0.50 |
llama.cpp r1: tg128 | 250.00 ± 1.30 | tg128 @ d4096 | 240.00 ± 1.20 |
base r2: tg128 | 502.00 ± 0.10 | tg128 @ d4096 | 452.00 ± 0.80 |
new r2: tg128 | 512.00 ± 0.20 |
llama.cpp r2: tg128 | 254.00 ± 1.30 | tg128 @ d4096 | 244.00 ± 1.20 |
""".splitlines()


def test_rounds_are_collected_per_side_and_test():
    runs = ab_table.parse(LINES)
    assert list(runs) == ["base", "new", "llama.cpp"]  # the import lines are not rounds
    assert dict(runs["base"]) == {"tg128": [500.0, 502.0], "tg128 @ d4096": [450.0, 452.0]}
    assert dict(runs["new"]) == {"tg128": [510.0, 512.0], "tg128 @ d4096": [459.0]}  # a cut-off round


def test_means_and_ratios():
    rows = {tuple(c.strip() for c in r.split("|")[1:3]): [c.strip() for c in r.split("|")[3:-1]]
            for r in ab_table.table(ab_table.parse(LINES))[2:]}
    # new tg128: mean 511 = base's 501 + 1.996%; llama.cpp's mean 252: 2.028x
    assert rows[("new", "tg128")] == ["510.00, 512.00", "511.00", "+2.00%", "2.028x", "-"]
    # new at depth: 459 against base's 451 (+1.77%), llama.cpp's 242 (1.897x), 459 / 511 = 89.8% of its tg128
    assert rows[("new", "tg128 @ d4096")] == ["459.00", "459.00", "+1.77%", "1.897x", "89.8%"]
    assert rows[("base", "tg128 @ d4096")][2:] == ["+0.00%", "1.864x", "90.0%"]
    assert rows[("llama.cpp", "tg128 @ d4096")] == ["240.00, 244.00", "242.00", "-", "-", "96.0%"]
