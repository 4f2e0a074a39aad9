"""Throughput measurement the way llama-bench does it: ``ppN`` (a prompt of N random tokens
processed from an empty cache) and ``tgN`` (N tokens decoded one at a time), each repeated after
warm-up runs, load time excluded. With a depth ``d`` (llama-bench ``-d``), each test first fills the
cache with ``d`` random tokens, untimed: ``pp512 @ d4096``, ``tg128 @ d4096``.

Two warm-up runs, not llama-bench's one: the first compiles the kernels (and captures the decode
graph), the second captures the prefill graph of that prompt length (``cuda_graphs`` captures a
prompt bucket the second time it sees it). One-off costs of this kind stay out of the figures.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from .engine import Engine


@dataclass
class BenchResult:
    test: str
    n_tokens: int
    samples_ts: list[float] = field(default_factory=list)

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return statistics.stdev(self.samples_ts) if len(self.samples_ts) > 1 else 0.0


def _sync(engine: Engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def _random_ids(engine: Engine, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.cfg.vocab_size, (n,), generator=g).tolist()


def _fill(engine: Engine, depth: int) -> None:
    """An empty cache, then ``depth`` random tokens in it (untimed)."""
    engine.reset()
    if depth:
        engine.prefill(_random_ids(engine, depth, 999))


def time_prompt(engine: Engine, n: int, seed: int = 0, depth: int = 0) -> float:
    ids = _random_ids(engine, n, seed)
    _fill(engine, depth)
    ids = engine.cached + ids  # prefill reuses the cached depth and runs the n new tokens
    _sync(engine)
    t0 = time.perf_counter()
    engine.prefill(ids)
    _sync(engine)
    return time.perf_counter() - t0


def time_gen(engine: Engine, n: int, seed: int = 0, depth: int = 0) -> float:
    ids = _random_ids(engine, n, seed)
    _fill(engine, depth)
    _sync(engine)
    t0 = time.perf_counter()
    for t in ids:
        engine.decode(t)
    _sync(engine)
    return time.perf_counter() - t0


WARMUP_RUNS = 2


def run_test(engine: Engine, kind: str, n: int, reps: int, depth: int = 0) -> BenchResult:
    fn = time_prompt if kind == "pp" else time_gen
    for w in range(WARMUP_RUNS):  # compilation, then CUDA graph capture
        fn(engine, n, seed=12345 + w, depth=depth)
    res = BenchResult(f"{kind}{n}" + (f" @ d{depth}" if depth else ""), n)
    for r in range(reps):
        res.samples_ts.append(n / fn(engine, n, seed=r, depth=depth))
    return res


def gpu_memory(engine: Engine) -> dict[str, float]:
    """GiB allocated now and at peak since the last reset (CUDA only)."""
    if engine.device.type != "cuda":
        return {}
    return {"allocated_gib": torch.cuda.memory_allocated(engine.device) / 2**30,
            "peak_gib": torch.cuda.max_memory_allocated(engine.device) / 2**30}


# -- batched serving (llama-batched-bench) ---------------------------------------------------------
@dataclass
class BatchedResult:
    pp: int
    tg: int
    b: int
    t_pp: float
    t_tg: float

    @property
    def n_kv(self) -> int:
        return self.b * (self.pp + self.tg)

    def row(self) -> dict:
        t = self.t_pp + self.t_tg
        return {"PP": self.pp, "TG": self.tg, "B": self.b, "N_KV": self.n_kv, "T_PP s": self.t_pp,
                "S_PP t/s": self.b * self.pp / self.t_pp, "T_TG s": self.t_tg,
                "S_TG t/s": self.b * self.tg / self.t_tg if self.t_tg else 0.0, "T s": t, "S t/s": self.n_kv / t}


def run_batched(be, pp: int, tg: int, b: int, seed: int = 0) -> BatchedResult:
    """``b`` sequences of ``pp`` random prompt tokens, all prefilled in one step (as
    llama-batched-bench does), then ``tg`` greedy tokens each, one decode step per token.
    T_PP ends when every prompt has its first token; T_TG is the decode steps after that. A request
    that ends without all its tokens (an error in a step) raises: no figure from a failed run."""
    from .batch_engine import Request
    from .sampling import SamplerConfig

    engine = be.engine
    first: set[str] = set()
    ends: list = []

    def on_event(e) -> None:
        first.add(e.request_id)
        if e.finished:
            ends.append(e)

    be.sched.step_tokens = max(b * pp, be.sched.segment)
    reqs = [Request(_random_ids(engine, pp, seed + i), tg + 1, SamplerConfig(temp=0), ignore_eos=True,
                    on_event=on_event) for i in range(b)]
    _sync(engine)
    t0 = time.perf_counter()
    for r in reqs:
        be.submit(r)
    while len(first) < b:
        be.step()
    _sync(engine)
    t1 = time.perf_counter()
    while be.step():
        pass
    _sync(engine)
    t2 = time.perf_counter()
    bad = [e for e in ends if e.finish_reason != "length" or e.completion_tokens != tg + 1]
    if bad or len(ends) != b:
        raise RuntimeError(f"batched run failed: {len(ends)} of {b} requests ended, "
                           f"{len(bad)} without their {tg + 1} tokens (first: {bad[0].error if bad else None})")
    return BatchedResult(pp, tg, b, t1 - t0, t2 - t1)


def batched_table(rows: list[BatchedResult]) -> str:
    head = ["PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"]
    out = ["| " + " | ".join(f"{h:>8}" for h in head) + " |", "|" + "|".join("-" * 10 for _ in head) + "|"]
    for r in rows:
        d = r.row()
        out.append("| " + " | ".join(f"{d[h]:>8}" if isinstance(d[h], int) else f"{d[h]:>8.3f}" if h.startswith("T")
                                      else f"{d[h]:>8.2f}" for h in head) + " |")
    return "\n".join(out)
