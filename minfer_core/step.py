"""What one forward is given (:class:`Step`), and how a single stream's rows attend.

:meth:`minfer_core.model.Transformer.forward` is the model's one forward: a prompt, a single-stream
decode step and a batched step over the paged pool are each a :class:`Step`, which says

- which tokens at which positions (device tensors: RoPE reads its tables at the positions),
- how the rows attend: a callable ``attention(model, layer, q, k, v, cos, sin)`` that applies RoPE,
  writes the rows' K/V where their sequence keeps them and returns the attention output (T, H D).
  :class:`ContiguousPrompt` and :class:`ContiguousToken` use the single stream's contiguous cache;
  :class:`~minfer_core.batch_forward.PagedRows` the paged pool through block tables,
- how the rows multiply (:mod:`minfer_core.matmuls`), and the output head's,
- which rows' logits come back.

The forward makes no other choice, so a new kind of pass is a new Step, not a new forward.
Shapes: T rows, H query heads, Hkv KV heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from .matmuls import Matmuls
from .weights import Activation


@dataclass
class Step:
    """The inputs of one forward (see the module docstring). ``logit_rows``: a slice or an int64
    device tensor of rows (None: every row); ``head_mm``: the output head's matmuls (default
    ``mm``)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    attention: Callable
    mm: Matmuls
    logit_rows: Union[slice, torch.Tensor, None] = None
    head_mm: Optional[Matmuls] = None


class ContiguousPrompt:
    """A single stream's rows at positions ``start ..``: K/V written to the contiguous cache from
    row ``start``, each row attending causally to the cache up to itself (the plan's ``prefill``
    attention)."""

    def __init__(self, start: int):
        self.start = start

    def __call__(self, model, i: int, q, k, v, cos, sin) -> torch.Tensor:
        cfg, rt, c, s = model.cfg, model.rt, model.cache, self.start
        T, H, Hkv, D = q.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q = rt._run(rt.pre_rope_kv, q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D), cos, sin,
                    c.k[i], c.v[i], s, cfg.rope_style == "neox")
        return rt.attend_prompt(model.p.layers[i].o, q, c.k[i, :s + T], c.v[i, :s + T], s)


class ContiguousToken:
    """One token at position ``pos`` ((1,) int64 on the device) of the contiguous cache, attending
    to the rows up to it (the plan's ``decode`` attention). Reads no host value of ``pos``."""

    def __init__(self, pos: torch.Tensor):
        self.pos = pos
        self.n_valid = (pos + 1).to(torch.int32).reshape(())

    def __call__(self, model, i: int, q, k, v, cos, sin) -> torch.Tensor:
        cfg, rt, c, n = model.cfg, model.rt, model.cache, model.n_ctx
        neox = cfg.rope_style == "neox"
        if "rope_kv" in rt.attn_decode.fuses:  # the attention rotates and writes row pos itself
            out = rt._run(rt.attn_decode, q[0], c.k[i, :n], c.v[i, :n], self.n_valid,
                          rope=(k[0], v[0], cos, sin, neox))
        else:
            q = rt._run(rt.dec_rope_kv, q[0], k[0], v[0], cos, sin, c.k[i], c.v[i], self.pos, neox)
            out = rt._run(rt.attn_decode, q, c.k[i, :n], c.v[i, :n], self.n_valid)
        if isinstance(out, Activation):  # with other forms of the same row (see Activation.forms)
            return Activation(out.f32.view(1, -1), forms=out.forms)
        return out.view(1, -1)
