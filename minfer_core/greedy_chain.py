"""A solo engine's greedy decode steps as two steps that feed each other on the device.

Step ``i`` (0 or 1) reads the token and the position that step ``1 - i`` left in its buffers, runs
the model's decode step, and leaves its greedy pick and the next position in its own. So a run of
greedy tokens needs nothing copied in before a step and no argmax launched after one: each step is
one replay of a CUDA graph (both are wrapped like the decode step, ``Engine.wrap_decode``), and the
pick's copy to the host is all that is left to do outside it.

Each step reads only the other's buffers, so running it twice on the same buffers (a graph's
warm-up and capture) writes the same values twice; a step's pick stays in its buffer until that
step runs again, two steps later.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .engine import Engine


class GreedyChain:
    def __init__(self, engine: Engine):
        model, dev = engine.model, engine.device
        argmax = engine.plan.decode_ops["argmax"].fn  # the greedy pick (hook minfer_argmax_candidates)
        self.token = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(2)]
        self.pos = [torch.zeros(1, dtype=torch.long, device=dev) for _ in range(2)]

        def make(i: int):
            def step() -> torch.Tensor:
                src_token, src_pos = self.token[1 - i], self.pos[1 - i]
                self.token[i].copy_(argmax(model.decode_step(src_token, src_pos)))
                torch.add(src_pos, 1, out=self.pos[i])
                return self.token[i]
            return engine.wrap_decode(step)

        self.steps = (make(0), make(1))
        self.last: Optional[int] = None  # the step that ran last (its buffers hold its pick)
        self.next_pos = -1  # the position of that pick

    def holds(self, token: Union[int, torch.Tensor], pos: int) -> bool:
        """Whether ``token`` is this chain's last pick (where it lies) and ``pos`` its position; if
        not, a call restarts the chain, rewriting both steps' buffers."""
        return (isinstance(token, torch.Tensor) and self.last is not None and pos == self.next_pos
                and token.data_ptr() == self.token[self.last].data_ptr())

    def __call__(self, token: Union[int, torch.Tensor], pos: int) -> torch.Tensor:
        """The greedy pick ``(1,)`` (on the device) after ``token`` (an id, or a ``(1,)`` device
        tensor) at position ``pos``. The tensor holds the pick until two calls later (read it back
        before the call after the next); passed back with the next position it costs no copy."""
        if self.holds(token, pos):
            i = 1 - self.last
        else:
            i = 0
            if isinstance(token, torch.Tensor):
                self.token[1].copy_(token.reshape(1))
            else:
                self.token[1].fill_(token)
            self.pos[1].fill_(pos)
        out = self.steps[i]()
        self.last, self.next_pos = i, pos + 1
        return out
