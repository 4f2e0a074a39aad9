"""How a pass multiplies its rows by a layer's weights: one call shape, three ways.

Every pass (a prompt, a single-stream decode step, a batched step) runs the same block,
:meth:`minfer_core.model.Transformer.layer`; what differs is which kernels multiply. A matmuls
object is called as ``mm(names, x, norm=None, swiglu=False, residual=None, plain_norm=False,
glu_into=None)`` and returns ``[residual +] f(x) @ W.T`` for each named weight, ``f`` the optional
RMSNorm ``norm=(w, eps)`` (``plain_norm``: the output head's, computed by torch) or SwiGLU of ``x =
[g | u]``; ``glu_into``: the products feed only the SwiGLU, whose output the weight ``glu_into``
multiplies next, so a prompt's kernels may return them in bf16, or a fused gate|up kernel the
SwiGLU's output itself (the other passes return float32).

- :class:`PromptMatmuls`: all rows at once, on the prefill kernels from ``PREFILL_ROWS`` rows (their
  activation producers fused), the decode kernels below. The fastest for one sequence; a row's
  bits may depend on how many rows there are. Handed an :class:`Activation` with ``swiglu=True``,
  it takes it as the SwiGLU's output (a gate|up kernel's ``Candidate.fuses`` ``"swiglu_out"``).
- :class:`DecodeMatmuls`: one row on the decode kernels, norm / SwiGLU / residual fused into them
  as each candidate declares (``glu_into`` asks a fused gate|up kernel for its SwiGLU forms,
  ``Candidate.fuses`` ``"glu_out"``).
- :class:`BatchMatmuls`: a batched step's rows, each of whose bits must not depend on the others:
  the plan's row-invariant kernels (``plan.batch``) over all rows, else fixed tiles of ``tile``
  rows (padded).
- :class:`TiledPromptMatmuls`: a batched step's prompt rows, just as independent of each other:
  every weight on its prefill kernel over fixed tiles (padded), sharing one weight expansion per
  step (``Candidate.tiled``), the cheapest way to run many prompt rows.
- :class:`SplitMatmuls`: a batched step's leading rows (generated positions) on one of those, the
  rest (prompt positions) on another.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import rmsnorm_rows as rmsnorm
from .weights import Activation

PREFILL_ROWS = 16  # matmuls with at least this many rows are "prefill"


def _add(ys: list[torch.Tensor], residual: torch.Tensor | None) -> list[torch.Tensor]:
    return ys if residual is None else [residual + y for y in ys]


class Matmuls:
    """The call shape every pass's matmuls share (see the module docstring)."""

    def __init__(self, rt):
        self.rt = rt  # the model's Runtime

    def __call__(self, names: list[str], x: torch.Tensor, norm: tuple | None = None, swiglu: bool = False,
                 residual: torch.Tensor | None = None, plain_norm: bool = False,
                 glu_into: str | None = None) -> list:
        raise NotImplementedError


class PromptMatmuls(Matmuls):
    def __call__(self, names, x, norm=None, swiglu=False, residual=None, plain_norm=False, glu_into=None):
        rt = self.rt
        if plain_norm:
            if x.shape[0] < PREFILL_ROWS:
                return _add(rt.decode_normed(names, x, norm), residual)
            a = rmsnorm(x, *norm)
        elif norm is not None:
            a = rt.rmsnorm(x, *norm)
        elif isinstance(x, Activation):  # written by its producer already: the prefill attention's plane,
            a = x  # or with swiglu the SwiGLU's output from the gate|up kernel
        elif swiglu:
            a = rt.swiglu(x)
        else:
            a = rt.produce(x) if x.shape[0] >= PREFILL_ROWS else x
        if len(names) == 1:
            return [rt.linear(names[0], a, residual, glu_into)]
        return _add([rt.linear(n, a, bf16_out=glu_into is not None) for n in names], residual)


class DecodeMatmuls(Matmuls):
    def __call__(self, names, x, norm=None, swiglu=False, residual=None, plain_norm=False, glu_into=None):
        rt = self.rt
        if norm is not None and residual is None and not swiglu:  # glu_into: the products feed only the SwiGLU
            return rt.decode_normed(names, x, norm, glu_out=glu_into is not None)
        return [rt.decode_linear(n, x, residual=residual, norm=norm, swiglu=swiglu) for n in names]


def _pad(x: torch.Tensor, tile: int) -> torch.Tensor:
    """``x`` with zero rows added up to a whole number of ``tile``-row tiles."""
    return F.pad(x, (0, 0, 0, -x.shape[0] % tile)) if x.shape[0] % tile else x


def row_tiles(n: int, tile: int) -> list[slice]:
    return [slice(r, r + tile) for r in range(0, n, tile)]


class BatchMatmuls(Matmuls):
    """``rows=False``: every weight over tiles, even where a row-invariant kernel exists."""

    def __init__(self, rt, tile: int, rows: bool):
        super().__init__(rt)
        self.tile, self.rows = tile, rows

    def __call__(self, names, x, norm=None, swiglu=False, residual=None, plain_norm=False, glu_into=None):
        rt, T = self.rt, x.shape[0]
        out: dict[str, torch.Tensor] = {}
        for n in names if self.rows else ():
            if n in rt.plan.batch:
                out[n] = rt.batch_linear(n, x, residual=residual, norm=norm, swiglu=swiglu)
        tiled = [n for n in names if n not in out]
        if tiled:
            xp = _pad(x, self.tile)
            parts: dict[str, list[torch.Tensor]] = {n: [] for n in tiled}
            for t in row_tiles(xp.shape[0], self.tile):
                a = xp[t]
                if norm is not None:
                    a = rt.produce(rmsnorm(a, *norm)) if plain_norm else rt.rmsnorm(a, *norm)
                elif swiglu:
                    a = rt.swiglu(a)
                for n in tiled:
                    parts[n].append(rt.linear(n, a))
            for n in tiled:
                y = (torch.cat(parts[n]) if len(parts[n]) > 1 else parts[n][0])[:T]
                out[n] = y if residual is None else residual + y
        return [out[n] for n in names]


class TiledPromptMatmuls(Matmuls):
    """Prompt rows: the norm / SwiGLU producers (row-wise kernels) over all rows, padded to whole
    tiles of ``tile`` rows (at least ``PREFILL_ROWS``), then each weight's prefill kernel tile by
    tile (:meth:`~minfer_core.model.Runtime.tiled_linear`)."""

    def __init__(self, rt, tile: int):
        super().__init__(rt)
        if tile < PREFILL_ROWS:
            raise ValueError(f"prompt tile {tile} is under {PREFILL_ROWS} rows")
        self.tile = tile

    def __call__(self, names, x, norm=None, swiglu=False, residual=None, plain_norm=False, glu_into=None):
        rt, T = self.rt, x.shape[0]
        xp = _pad(x, self.tile)
        if norm is not None:
            a = rt.produce(rmsnorm(xp, *norm)) if plain_norm else rt.rmsnorm(xp, *norm)
        elif swiglu:
            a = rt.swiglu(xp)
        else:
            a = rt.produce(xp)
        return _add([rt.tiled_linear(n, a, self.tile)[:T] for n in names], residual)


class SplitMatmuls(Matmuls):
    """Rows ``[0, split)`` on ``head``, the rest on ``tail``, one call each; the outputs joined
    (``0 < split < rows``)."""

    def __init__(self, head: Matmuls, tail: Matmuls, split: int):
        super().__init__(head.rt)
        self.head, self.tail, self.split = head, tail, split

    def __call__(self, names, x, norm=None, swiglu=False, residual=None, plain_norm=False, glu_into=None):
        s = self.split
        r = (None, None) if residual is None else (residual[:s], residual[s:])
        a = self.head(names, x[:s], norm, swiglu, r[0], plain_norm)
        b = self.tail(names, x[s:], norm, swiglu, r[1], plain_norm)
        return [torch.cat([u, v]) for u, v in zip(a, b)]
