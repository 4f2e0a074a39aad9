"""minfer beside llama.cpp on the same GGUF files, in one process run: one markdown table.

    python benchmarks/vs_llamacpp.py --models /tmp/7b.gguf /tmp/05b.gguf --llama-bin /tmp/llamacpp/b/bin \
        [-p 512,3314] [-n 128] [-d 0,4096] [-r 3] [--config default --config MINFER_MMQ=0]
        [--batched 1,8,32,128] [--row-tile 64,128] > table.md

For every model: ``minfer bench -o json --memory`` and ``llama-bench -o json -fa 1 -ngl 99`` with the
same ``-p`` / ``-n`` / ``-d`` / ``-r``, one row per test and minfer configuration (``--config``, as
``minfer bench --config``) with both figures and their ratio, and minfer's GPU memory; then, with ``--batched``, ``minfer bench --batch`` (once per ``--row-tile``) beside
``llama-batched-bench -npp 128 -ntg 128 -npl``, one row per sequence count. Without ``--llama-bin`` (or
when a binary is missing) the llama.cpp columns read "-". Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def run_json(cmd: list[str], timeout: int) -> list | None:
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"  failed: {e}", file=sys.stderr)
        return None
    if p.returncode != 0:
        print(f"  exit {p.returncode}: {p.stderr.strip()[-400:]}", file=sys.stderr)
        return None
    try:
        data = json.loads(p.stdout)
        if isinstance(data, list):
            return data
    except json.JSONDecodeError:
        pass
    # jsonl (llama-batched-bench logs its lines; take the objects from either stream)
    rows = [json.loads(ln) for ln in (p.stdout + "\n" + p.stderr).splitlines() if ln.startswith("{")]
    return [r for r in rows if isinstance(r, dict)] or None


def test_name(n_prompt: int, n_gen: int, depth: int = 0) -> str:
    return (f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}") + (f" @ d{depth}" if depth else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--llama-bin", type=Path, help="folder holding llama-bench and llama-batched-bench")
    ap.add_argument("-p", default="512,3314")
    ap.add_argument("-n", default="128")
    ap.add_argument("-d", default="0", help="cache depths (llama-bench -d)")
    ap.add_argument("-r", default="3")
    ap.add_argument("--config", action="append", default=[], help="minfer configurations (minfer bench --config)")
    ap.add_argument("--batched", default="", help="sequence counts for minfer bench --batch / llama-batched-bench -npl")
    ap.add_argument("--row-tile", default="", help="minfer's batched row tiles to try, comma-separated (default: its own)")
    ap.add_argument("--timeout", type=int, default=400)
    a = ap.parse_args()
    lb = a.llama_bin / "llama-bench" if a.llama_bin else None
    lbb = a.llama_bin / "llama-batched-bench" if a.llama_bin else None

    out = ["| model | test | config | llama.cpp t/s | minfer t/s | minfer / llama.cpp | minfer mem load / peak |",
           "|---|---|---|---:|---:|---:|---:|"]
    print("\n".join(out), flush=True)  # rows follow as each model finishes (a cut-off run keeps them)
    batched = []
    for model in a.models:
        out = []
        name = Path(model).name
        mine = run_json([sys.executable, "-m", "minfer_core.cli", "bench", "-m", model, "-p", a.p, "-n", a.n,
                         "-d", a.d, "-r", a.r, "--memory", "-o", "json"]
                        + [x for c in a.config for x in ("--config", c)], a.timeout) or []
        ref = {}
        if lb and lb.exists():
            for r in run_json([str(lb), "-m", model, "-p", a.p, "-n", a.n, "-d", a.d, "-r", a.r, "-fa", "1",
                               "-ngl", "99", "-o", "json"], a.timeout) or []:
                ref[test_name(r["n_prompt"], r["n_gen"], r.get("n_depth", 0))] = (r["avg_ts"], r["stddev_ts"])
        for r in mine:
            ours, theirs = r["avg_ts"], ref.get(r["test"])
            mem = f"{r['mem_load_gib']:.2f} / {r['mem_peak_gib']:.2f} GiB" if "mem_load_gib" in r else "-"
            out.append(f"| {name} | {r['test']} | {r.get('config', 'default')} | "
                       + (f"{theirs[0]:,.1f} ± {theirs[1]:,.1f}" if theirs else "-")
                       + f" | {ours:,.1f} ± {r['stddev_ts']:,.1f} | "
                       + (f"{ours / theirs[0]:.2f}x" if theirs else "-") + f" | {mem} |")
        print("\n".join(out), flush=True)
        if a.batched:
            batched.append(batched_rows(a, name, model, lbb))
            print(f"\n{name}, batched (-p 128 -n 128 per sequence; llama-batched-bench -npp 128 -ntg 128):\n")
            print("| model | B | minfer row tile | llama.cpp S_PP | minfer S_PP | llama.cpp S_TG | minfer S_TG | S_TG ratio |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            print("\n".join(batched[-1]) + "\n", flush=True)
    return 0


def batched_rows(a, name: str, model: str, lbb) -> list[str]:
    ref = {}
    if lbb and lbb.exists():
        ctx = max(int(b) for b in a.batched.split(",")) * 256 + 256
        for r in run_json([str(lbb), "-m", model, "-c", str(ctx), "-fa", "on", "-ngl", "99", "-npp", "128",
                           "-ntg", "128", "-npl", a.batched, "--output-format", "jsonl"], a.timeout) or []:
            ref[int(r.get("pl", 0))] = (r.get("speed_pp", 0.0), r.get("speed_tg", 0.0))
    rows = []
    for tile in a.row_tile.split(",") if a.row_tile else [""]:
        mine = run_json([sys.executable, "-m", "minfer_core.cli", "bench", "-m", model, "--batch", a.batched,
                         "-p", "128", "-n", "128", "-o", "json"] + (["--row-tile", tile] if tile else []),
                        a.timeout) or []
        for r in mine:
            b = r["B"]
            lpp, ltg = ref.get(b, (0.0, 0.0))
            ratio = f"{r['S_TG t/s'] / ltg:.2f}x" if ltg else "-"
            rows.append(f"| {name} | {b} | {tile or 'default'} | {lpp:,.1f} | {r['S_PP t/s']:,.1f} | {ltg:,.1f} | "
                        f"{r['S_TG t/s']:,.1f} | {ratio} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
