"""``minfer parity``: compare greedy streams (and first-step logits) between configurations."""

from __future__ import annotations

import json
import sys

import torch

from ..errors import UserError
from . import values
from .common import log

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser("parity", help="compare greedy token streams between configurations",
                       description="Load the model once per configuration, generate -n greedy tokens from the same "
                                   "prompt, and compare every stream (and the prompt's last logits) with the first "
                                   "configuration's. Exit status 1 if any stream differs.")
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name")
    p.add_argument("-p", "--prompt", type=values.utf8_text, default="The quick brown fox", help="prompt text")
    p.add_argument("-n", "--n-predict", type=values.count, default=128, help="greedy tokens per configuration (default: 128)")
    p.add_argument("--config", action="append", default=[], metavar="SPEC",
                   help="'default' or KEY=VALUE[,..] (MINFER_* env, backend=NAME, plugin=no:NAME); repeatable; "
                        "the first is the baseline (default: default vs all gates explicitly on)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--batch", type=int, metavar="N",
                   help="batched mode instead: the prompt's greedy stream alone vs among N-1 other requests "
                        "(staggered, different lengths) in the batched engine, and vs the single-stream engine")
    return p


def all_on() -> str:
    """A configuration with every installed plugin's gates set explicitly: switches "1", modes their
    declared default (the default path spelled out, for the neutrality comparison)."""
    from ..gates import declared_gates
    from ..plugins import get_plugin_manager

    gates = declared_gates(get_plugin_manager()).values()
    return ",".join(f"{g.name}={'1' if g.kind == 'switch' else g.default}" for g in gates if g.group == "gate")


def greedy_stream(engine, prompt: str, n: int) -> tuple[list[int], torch.Tensor, list[float]]:
    """Greedy tokens, the prompt's last logits, and the top-2 logit margin before each token."""
    ids = engine.tok.encode(prompt, add_special=True, parse_special=True)
    if len(ids) + n > engine.model.n_ctx:  # n_ctx (context_for) holds any prompt unless the model is shorter
        raise UserError(f"the prompt ({len(ids)} tokens) and -n {n} need a context of {len(ids) + n} tokens, "
                        f"more than the model's {engine.model.n_ctx}")
    engine.reset()
    logits = engine.prefill(ids)[-1].float().cpu()
    out, margins, cur = [], [], logits
    for _ in range(n):
        top = torch.topk(cur.float().cpu(), 2).values
        margins.append(float(top[0] - top[1]))
        t = int(torch.argmax(cur))
        out.append(t)
        if len(out) == n:
            break
        cur = engine.decode(t)
    return out, logits, margins


def context_for(prompt: str, n: int) -> int:
    """Context for ``n`` tokens after the prompt: a token holds one byte of it at least (plus BOS, EOS and
    a space prefix), and 512 at the least."""
    return n + max(512, len(prompt.encode("utf-8")) + 4)


def run(args) -> int:
    from ..run_configs import load_under, parse_config
    from ..fetch import resolve_model

    if args.batch is not None:
        return _run_batched(args)
    specs = args.config or ["default", all_on()]
    if len(specs) < 2:
        raise UserError("parity needs at least two configurations")
    path = resolve_model(args.model)
    results = []
    for spec in specs:
        cfg = parse_config(spec)
        engine = load_under(cfg, path, args, n_ctx=context_for(args.prompt, args.n_predict))
        tokens, logits, margins = greedy_stream(engine, args.prompt, args.n_predict)
        results.append((spec, tokens, logits, engine.tok.decode(tokens), margins))
        log(f"parity: {spec}: {len(tokens)} tokens")
        del engine
    base_spec, base_tokens, base_logits, _, base_margins = results[0]
    report, same_all = [], True
    for spec, tokens, logits, text, _ in results:
        first_diff = next((i for i, (a, b) in enumerate(zip(base_tokens, tokens)) if a != b), None)
        diff = (logits - base_logits).abs()
        rel = float(diff.norm() / base_logits.norm())
        same = tokens == base_tokens
        same_all &= same
        report.append({"config": spec, "identical": same, "first_divergence": first_diff,
                       "max_abs_logit_diff": float(diff.max()), "rel_logit_diff": rel, "text": text,
                       # the baseline's top-2 margin where the streams part: a margin under twice the
                       # logit difference is a near-tie that rounding may flip either way
                       "baseline_margin_at_divergence": None if first_diff is None else base_margins[first_diff],
                       "min_baseline_margin_before": min(base_margins[:first_diff or len(base_margins)], default=None)})
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in report:
            status = "identical" if r["identical"] else (
                f"DIFFERS at token {r['first_divergence']} (baseline top-2 margin there "
                f"{r['baseline_margin_at_divergence']:.4g}"
                + ("; a near-tie" if r["baseline_margin_at_divergence"] < 2 * r["max_abs_logit_diff"] else "") + ")")
            print(f"{r['config']}: {status}; prompt logits max|d| {r['max_abs_logit_diff']:.4g}, rel {r['rel_logit_diff']:.3g}")
        print(f"baseline ({base_spec}) text: {report[0]['text']!r}")
    return 0 if same_all else 1


def _run_batched(args) -> int:
    from ..batch_engine import BatchEngine, Request
    from ..run_configs import load_under, parse_config
    from ..fetch import resolve_model
    from ..sampling import SamplerConfig

    if args.batch < 1:
        raise UserError("--batch must be at least 1")
    if len(args.config) > 1:
        raise UserError("parity --batch takes at most one --config")
    path = resolve_model(args.model)
    engine = load_under(parse_config((args.config or ["default"])[0]), path, args,
                        n_ctx=context_for(args.prompt, args.n_predict))
    ids = engine.tok.encode(args.prompt, add_special=True, parse_special=True)
    single, _, _ = greedy_stream(engine, args.prompt, args.n_predict)
    per_seq = -(-engine.model.n_ctx // 16)
    be = BatchEngine(engine, parallel=args.batch, max_queue=args.batch, n_blocks=args.batch * per_seq)
    g = torch.Generator().manual_seed(0)
    out: dict[str, list[int]] = {}

    def request(prompt_ids, n):
        r = Request(prompt_ids, n, SamplerConfig(temp=0), ignore_eos=True)
        out[r.id] = []
        r.on_event = lambda e: out[e.request_id].extend(e.token_ids)
        return r

    def run(reqs_at: dict[int, list]) -> None:
        step = 0
        while be.step() or step <= max(reqs_at):
            for r in reqs_at.get(step, []):
                be.submit(r)
            step += 1

    target = request(ids, args.n_predict)
    run({0: [target]})
    alone = out[target.id]
    others = [request(torch.randint(0, engine.cfg.vocab_size, (int(n),), generator=g).tolist(), args.n_predict)
              for n in torch.randint(4, 400, (args.batch - 1,), generator=g)]
    among_req = request(ids, args.n_predict)
    half = len(others) // 2
    run({0: others[:half], 3: [among_req] + others[half:]})
    among = out[among_req.id]
    rows = [("alone vs among %d others" % (args.batch - 1), alone, among),
            ("batched alone vs single-stream engine", single, alone)]
    for label, a, b in rows:
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print(f"{label}: " + ("identical" if a == b else f"DIFFERENT from token {d}"))
    print(f"text: {engine.tok.decode(alone)!r}")
    return 0 if alone == among else 1
