"""The CLI's engine: ``minfer run`` and ``minfer chat`` go through the batched engine with one
sequence at a time (``BatchEngine(solo=True)``), the server's request life cycle (end tokens, stop
strings, limits, the prefix cache), on the single-stream passes: the same bits as
:meth:`Engine.generate <minfer_core.engine.Engine.generate>`, at its speed (``benchmarks/bench_solo.py``).
Greedy decode steps overlap as the batched engine's do: each is launched before the last is read back.
``BatchEngine.load`` builds such an engine for ``--parallel 1`` (``minfer serve``, ``minfer bench
--batch 1``).

Its pool holds one context; a finished request's full blocks stay cached, so a chat's next turn
(the conversation re-rendered) prefills only what follows the last whole block both turns share.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from .batch_engine import BatchEngine, Event, Request
from .engine import Engine, Generation
from .sampling import Sampler, SamplerConfig

BLOCK = 16  # rows a KV block


def solo_engine(engine: Engine) -> BatchEngine:
    """A one-sequence engine over ``engine``'s model (its K/V cache becomes the engine's pool; the
    engine's own single-stream cache bookkeeping is reset)."""
    n_ctx = engine.model.n_ctx
    engine.reset()
    return BatchEngine(engine, parallel=1, max_queue=1, n_blocks=-(-n_ctx // BLOCK), block_size=BLOCK,
                       step_tokens=max(n_ctx, BLOCK), solo=True)


def generate(be: BatchEngine, ids: Sequence[int], n_predict: int = -1, sampling: Optional[SamplerConfig] = None,
             stop: Sequence[str] = (), on_text: Optional[Callable[[str], None]] = None,
             sampler: Optional[Sampler] = None) -> Generation:
    """Continue ``ids`` as :meth:`Engine.generate <minfer_core.engine.Engine.generate>` does (same
    arguments and result), as a request of ``be``; timings go to ``be.engine.timings`` and the number
    of prompt tokens actually run to ``be.engine.last_prefill``. An exception from ``on_text`` (a closed
    stdout) cancels the request and is raised here, as ``Engine.generate`` lets it through."""
    engine, out, ended = be.engine, Generation(), []
    marks: list[float] = []
    failed: list[Exception] = []  # what on_text raised (a closed stdout): the request is cancelled, then it is raised
    silent = n_predict == 0  # the prompt only: its one sampled token is dropped

    def on_event(ev: Event) -> None:
        if ev.finished:
            ended.append(ev)
        if not marks:
            marks.append(time.perf_counter())  # the first token is sampled: the prompt is done
        if not silent:
            out.tokens.extend(ev.token_ids)
            if ev.text:
                out.text += ev.text
                if on_text and not failed:
                    try:
                        on_text(ev.text)
                    except Exception as e:  # the caller's, not the engine's: stop and hand it back
                        failed.append(e)
                        be.cancel(ev.request_id)

    hits = be.pool.hits
    t0 = time.perf_counter()
    be.submit(Request(list(ids), max_tokens=1 if silent else n_predict, sampling=sampling or SamplerConfig(),
                      stop=tuple(stop), on_event=on_event, sampler=sampler))
    while not ended:
        be.step()
    if failed:
        raise failed[0]
    t2 = time.perf_counter()
    ev = ended[0]
    if ev.finish_reason == "error":
        raise RuntimeError(ev.error)
    out.stop_reason = "length" if silent else ev.finish_reason
    t1 = marks[0] if marks else t2
    engine.last_prefill = len(ids) - (be.pool.hits - hits) * be.block_size
    t = engine.timings
    t.prompt_tokens, t.prompt_s = len(ids), t1 - t0
    t.gen_tokens, t.gen_s = len(out.tokens), t2 - t1
    return out
