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
    p.add_argument("-p", "--prompt", default="The quick brown fox", help="prompt text")
    p.add_argument("-n", "--n-predict", type=values.count, default=128, help="greedy tokens per configuration (default: 128)")
    p.add_argument("--config", action="append", default=[], metavar="SPEC",
                   help="'default' or KEY=VALUE[,..] (MINFER_* env, backend=NAME, plugin=no:NAME); repeatable; "
                        "the first is the baseline (default: default vs all gates explicitly on)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return p


ALL_ON = ",".join(f"{g}=1" for g in ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE",
                                     "MINFER_MMQ_Q6K_NB")) + ",MINFER_MMQ_A_FUSE=2"


def greedy_stream(engine, prompt: str, n: int) -> tuple[list[int], torch.Tensor, list[float]]:
    """Greedy tokens, the prompt's last logits, and the top-2 logit margin before each token."""
    ids = engine.tok.encode(prompt, add_special=True, parse_special=True)
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


def run(args) -> int:
    from ..configs import load_under, parse_config
    from ..fetch import resolve_model

    specs = args.config or ["default", ALL_ON]
    if len(specs) < 2:
        raise UserError("parity needs at least two configurations")
    path = resolve_model(args.model)
    results = []
    for spec in specs:
        cfg = parse_config(spec)
        engine = load_under(cfg, path, args, n_ctx=args.n_predict + 512)
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
