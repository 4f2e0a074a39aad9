"""``minfer bench``: llama-bench's table (pp/tg throughput as mean ± stddev), optionally swept over gates."""

from __future__ import annotations

import gc
import json
import sys

import torch

from ..errors import UserError
from ..matmuls import PREFILL_ROWS
from . import values
from .common import check_fits, log

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("bench", help="measure prompt processing and generation speed (llama-bench style)",
                       description="For each -p N: process N random tokens from an empty cache; for each -n N: "
                                   "generate N tokens one at a time. Each test runs twice to warm up (compile, capture graphs), then -r times; "
                                   "load time is excluded. Prints a markdown table (or JSON) on stdout.")
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("-p", "--n-prompt", type=values.counts, default=[512], help="prompt lengths, comma-separated (default: 512; 0 = none)")
    p.add_argument("-n", "--n-gen", type=values.counts, default=[128], help="generation lengths, comma-separated (default: 128; 0 = none)")
    p.add_argument("-d", "--n-depth", type=values.counts, default=[0],
                   help="cache depths, comma-separated: each test runs after that many random tokens are in the "
                        "cache, untimed (default: 0)")
    p.add_argument("-r", "--repetitions", type=values.positive, default=5, help="repetitions of each test (default: 5)")
    p.add_argument("-o", "--output", choices=("md", "json"), default="md", help="output format (default: md)")
    p.add_argument("--config", action="append", default=[], metavar="SPEC",
                   help="run under this configuration: 'default' or KEY=VALUE[,..] with MINFER_* env overrides, "
                        "backend=NAME, plugin=no:NAME (repeatable; each loads the model anew)")
    p.add_argument("--gates", action="store_true",
                   help="A/B sweep: the default, then each declared gate (group gate) at \"0\", then each other mode of a mode gate")
    p.add_argument("--memory", action="store_true", help="add GPU memory after load and at peak (GiB)")
    p.add_argument("--batch", metavar="B,..", type=values.counts,
                   help="batched serving instead (llama-batched-bench's table): for each B, B sequences of -p "
                        "prompt tokens prefilled together, then -n tokens each decoded together")
    p.add_argument("--row-tile", type=values.positive, metavar="N",
                   help="with --batch: decoding rows per fixed matmul tile of the batched engine (default on CUDA "
                        "by B: 16 up to 16 sequences, 32 up to 32, 64 up to 64, else 128; 16 on the CPU), at least "
                        "16; a step of B rows runs every tiled matmul ceil(B / N) times")
    p.add_argument("--prompt-tile", type=values.positive, metavar="N",
                   help="with --batch: prompt rows per fixed matmul tile, at least 16 (default: 256 on CUDA, 16 on "
                        "the CPU); each weight is expanded once a step and multiplied N rows at a time")
    p.add_argument("--no-solo", action="store_true",
                   help="with --batch 1: run the one sequence on the batched step (paged attention) instead of "
                        "the single-stream passes, which an engine of one sequence uses by default (as minfer "
                        "serve --parallel 1 does)")
    return p


def run(args) -> int:
    from ..throughput import gpu_memory, run_test
    from ..cli import blocked_plugins
    from ..run_configs import load_under, parse_config, sweep
    from ..gates import declared_gates
    from ..plugins import get_plugin_manager
    from ..fetch import resolve_model

    tests = [("pp", n) for n in args.n_prompt if n > 0] + [("tg", n) for n in args.n_gen if n > 0]
    if not tests:
        raise UserError("nothing to run: give -p or -n")
    if args.batch:
        return _run_batched(args, tests)
    gates = declared_gates(get_plugin_manager(blocked=blocked_plugins(args))) if args.gates else {}
    specs = list(args.config) + list(sweep(gates) if args.gates else [])
    configs = [parse_config(s) for s in (specs or ["default"])]
    depths = args.n_depth or [0]
    path = resolve_model(args.model)
    kind, n = max(tests, key=lambda t: t[1])
    check_fits(path, n + max(depths), f"bench {kind}{n}" + (f" @ d{max(depths)}" if max(depths) else ""))
    n_ctx = n + max(depths) + 16
    rows = []
    for cfg in configs:
        engine = load_under(cfg, path, args, n_ctx)
        mem_load = gpu_memory(engine)
        for (kind, n), depth in ((t, d) for t in tests for d in depths):
            if engine.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(engine.device)
            res = run_test(engine, kind, n, args.repetitions, depth)
            row = _row(engine, path, cfg.label, res)
            if args.memory and mem_load:
                row["mem_load_gib"] = mem_load["allocated_gib"]
                row["mem_peak_gib"] = gpu_memory(engine)["peak_gib"]
            rows.append(row)
            log(f"bench: {cfg.label}: {res.test}: {row['avg_ts']:.2f} ± {row['stddev_ts']:.2f} t/s")
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.output == "json":
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _markdown(rows, args.memory)
    return 0


def _row(engine, path, config: str, res) -> dict:
    labels = sorted({k.label for k in engine.plan.prefill.values()})
    return {
        "model": f"{engine.cfg.arch} {engine.cfg.name}",
        "model_filename": str(path),
        "size_gib": path.stat().st_size / 2**30,
        "params_b": engine.n_params / 1e9,
        "backend": _backend_label(engine),
        "config": config,
        "fuse_mode": engine.plan.fuse_mode,
        "prefill_kernels": labels,
        "test": res.test,
        "n_tokens": res.n_tokens,
        "avg_ts": res.avg_ts,
        "stddev_ts": res.stddev_ts,
        "samples_ts": res.samples_ts,
        "device": torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu",
    }


def _backend_label(engine) -> str:
    plugins = sorted({k.plugin for k in list(engine.plan.prefill.values()) + list(engine.plan.decode.values())})
    graph = "+graph" if engine.plan.decode_step is not None else ""
    return ",".join(plugins) + graph


def _markdown(rows: list[dict], memory: bool) -> None:
    head = ["model", "size", "params", "backend", "config", "test", "t/s"]
    if memory:
        head += ["mem load", "mem peak"]
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" if h in ("model", "backend", "config") else "---:" for h in head) + " |")
    for r in rows:
        cells = [r["model"], f"{r['size_gib']:.2f} GiB", f"{r['params_b']:.2f} B", r["backend"], r["config"],
                 r["test"], f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"]
        if memory:
            cells += [f"{r.get('mem_load_gib', 0):.2f} GiB", f"{r.get('mem_peak_gib', 0):.2f} GiB"]
        print("| " + " | ".join(cells) + " |")
    if rows:
        print(f"\npolicy: fuse mode {rows[0]['fuse_mode']} (first config); prefill kernels: "
              + "; ".join(f"{r['config']}: {','.join(r['prefill_kernels'])}" for r in rows if r["test"].startswith("pp"))[:2000])


def _run_batched(args, tests) -> int:
    from ..batch_engine import BatchEngine, check_row_tile
    from ..throughput import WARMUP_RUNS, batched_table, run_batched
    from ..run_configs import load_under, parse_config
    from ..fetch import resolve_model

    batches = [b for b in args.batch if b > 0]
    pps = [n for k, n in tests if k == "pp"] or [0]
    tgs = [n for k, n in tests if k == "tg"] or [0]
    if not batches or 0 in pps or 0 in tgs:
        raise UserError("--batch needs batch sizes and both -p and -n")
    if any(args.n_depth or []):
        raise UserError("-d is for the single-stream tests: --batch runs every sequence from an empty cache")
    if args.prompt_tile is not None and args.prompt_tile < PREFILL_ROWS:
        raise UserError(f"--prompt-tile {args.prompt_tile}: a prompt tile holds at least {PREFILL_ROWS} rows")
    if args.row_tile is not None:
        check_row_tile(args.row_tile, "--row-tile")  # before the model loads
    path = resolve_model(args.model)
    # each sequence samples tg + 1 tokens after its prompt (the first one ends T_PP)
    check_fits(path, max(pps) + max(tgs) + 1, f"bench --batch -p {max(pps)} -n {max(tgs)}")
    n_ctx = max(pps) + max(tgs) + 16
    results = []
    for cfg in [parse_config(s) for s in (args.config or ["default"])]:
        engine = load_under(cfg, path, args, n_ctx)
        per_seq = -(-engine.model.n_ctx // 16)
        for b in batches:  # one engine per batch size, as `minfer serve --parallel B` would run it
            be = BatchEngine(engine, parallel=b, max_queue=b, n_blocks=b * per_seq, row_tile=args.row_tile,
                             prompt_tile=args.prompt_tile, solo=b == 1 and not args.no_solo)
            for w in range(WARMUP_RUNS):  # compilation, then the graphs captured (a solo engine's prefill
                run_batched(be, min(pps), 2, b, seed=12345 + w)  # graph at the second prompt of its length)
            for pp in pps:
                for tg in tgs:
                    res = run_batched(be, pp, tg, b)
                    results.append((cfg.label, res))
                    log(f"bench: {cfg.label}: pp {pp} tg {tg} B {b}: S_PP {res.row()['S_PP t/s']:.1f} t/s, "
                        f"S_TG {res.row()['S_TG t/s']:.1f} t/s" + ("" if be.rows else " (row tiles)"))
            del be
            gc.collect()
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.output == "json":
        json.dump([dict(r.row(), config=label) for label, r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for label in dict.fromkeys(lbl for lbl, _ in results):
            if len(args.config) > 1:
                print(f"\nconfig: {label}")
            print(batched_table([r for lbl, r in results if lbl == label]))
    return 0
