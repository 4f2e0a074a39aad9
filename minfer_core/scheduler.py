"""Continuous batching: which sequences run in the next step, and which of their tokens.

Each step takes every decoding sequence (one token each), then prompt chunks of the oldest
prefilling sequences while the step's token budget lasts, so a long prompt never stalls the
running streams. Blocks are taken per step; when they run out the youngest sequence is preempted
(its blocks freed, itself requeued at the front to be recomputed), never dropped.

Where a sequence's tokens are cut into attention calls depends on that sequence alone, which keeps
a request's output the same whatever runs beside it: prompt positions go in calls aligned to
``segment`` tokens (cut short at the prompt's end), generated positions one per call. The prefix
cache shares only blocks of whole prompt segments, and a prefix hit is a whole number of segments,
so a hit and a miss compute every position in the same calls.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from .kv_pages import ROOT, BlockPool, block_key


@dataclass(eq=False)  # identity: `in self.running` must not run a field-by-field __eq__ (B^2 calls a step)
class Sequence:
    id: str
    tokens: list[int]  # prompt, then generated tokens
    n_prompt: int
    order: int  # admission order of arrival: lower is older
    blocks: list[int] = field(default_factory=list)
    n_computed: int = 0  # leading tokens whose K/V are in the cache
    n_registered: int = 0  # leading blocks that are in the prefix cache (found or registered)
    parent_key: bytes = ROOT  # prefix-cache key of block n_registered - 1
    data: Any = None  # the owner's per-request state

    @property
    def decoding(self) -> bool:
        return self.n_computed == len(self.tokens) - 1 and self.n_computed >= self.n_prompt


@dataclass
class Work:
    seq: Sequence
    calls: list[tuple[int, int]]  # (first position, end position) of each attention call

    @property
    def start(self) -> int:
        return self.calls[0][0]

    @property
    def end(self) -> int:
        return self.calls[-1][1]


class Scheduler:
    def __init__(self, pool: BlockPool, *, parallel: int, segment: int, step_tokens: int, share_all: bool = False):
        if segment % pool.block_size:
            raise ValueError(f"segment {segment} is not a multiple of the block size {pool.block_size}")
        if step_tokens < segment:
            raise ValueError(f"step token budget {step_tokens} is smaller than a segment ({segment})")
        self.pool, self.parallel, self.segment, self.step_tokens = pool, parallel, segment, step_tokens
        # a removed sequence's every full computed block stays in the prefix cache, generated ones too
        # (a one-sequence engine, whose next request may continue this one: a chat's next turn)
        self.share_all = share_all
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.preemptions = 0

    # -- queues ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished, cancelled, failed) and free its blocks (with ``share_all``
        its full computed blocks stay findable)."""
        if self.share_all:
            self.share(seq, seq.n_computed)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.free(seq.blocks)
        seq.blocks = []

    def call_end(self, seq: Sequence, pos: int) -> int:
        """End of the attention call that starts at ``pos``."""
        if pos >= seq.n_prompt:
            return pos + 1
        return min((pos // self.segment + 1) * self.segment, seq.n_prompt)

    def _blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.pool.block_size)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.parallel:
            seq = self.waiting[0]
            self._take_prefix(seq)
            first_end = self.call_end(seq, seq.n_computed)
            if self._blocks_for(first_end) - len(seq.blocks) > self.pool.n_free:
                self.pool.free(seq.blocks)  # not now: give the prefix back and wait for blocks
                seq.blocks, seq.n_computed, seq.n_registered, seq.parent_key = [], 0, 0, ROOT
                return
            self.waiting.popleft()
            self.running.append(seq)
            self.running.sort(key=lambda s: s.order)

    def _take_prefix(self, seq: Sequence) -> None:
        """Start ``seq`` from the longest cached run of whole segments of its prompt."""
        per_seg = self.segment // self.pool.block_size
        full = min(seq.n_prompt // self.segment * self.segment, len(seq.tokens) - 1)
        hit = self.pool.match(seq.tokens, full // self.segment * per_seg)
        keep = len(hit) // per_seg * per_seg
        self.pool.free(hit[keep:])
        seq.blocks = hit[:keep]
        seq.n_computed = keep * self.pool.block_size
        seq.n_registered = keep
        seq.parent_key = self.pool.key_of[hit[keep - 1]] if keep else ROOT

    # -- a step ------------------------------------------------------------------------------
    def schedule(self) -> list[Work]:
        """The work of the next step with its blocks allocated (preempting when they run out)."""
        self._admit()
        budget, plan = self.step_tokens, []
        for seq in self.running:
            if seq.decoding:
                plan.append(Work(seq, [(seq.n_computed, seq.n_computed + 1)]))
                budget -= 1
        free = self.pool.n_free - sum(self._blocks_for(w.end) - len(w.seq.blocks) for w in plan)
        for seq in self.running:
            if seq.decoding:
                continue
            calls, pos = [], seq.n_computed
            while pos < len(seq.tokens):
                end = self.call_end(seq, pos)
                if end - pos > budget and (calls or plan):
                    break
                if calls and self._blocks_for(end) - len(seq.blocks) > free:
                    break  # a later call waits for blocks rather than preempt (its own sequence, often)
                calls.append((pos, end))
                budget -= end - pos
                pos = end
            if calls:
                plan.append(Work(seq, calls))
                free -= self._blocks_for(pos) - len(seq.blocks)
        plan.sort(key=lambda w: w.seq.order)
        return self._allocate(plan)

    def _allocate(self, plan: list[Work]) -> list[Work]:
        done: list[Work] = []
        for w in plan:
            if w.seq not in self.running:  # preempted for an older sequence of this step
                continue
            need = self._blocks_for(w.end) - len(w.seq.blocks)
            while need > self.pool.n_free:
                victim = self.running[-1]
                self.preempt(victim)
                if victim is w.seq:
                    break
                done = [d for d in done if d.seq is not victim]
            if w.seq not in self.running:
                continue
            w.seq.blocks += [self.pool.allocate() for _ in range(need)]
            done.append(w)
        return done

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks and requeue it (at the front) to be recomputed."""
        self.running.remove(seq)
        self.pool.free(seq.blocks)
        seq.blocks, seq.n_computed, seq.n_registered, seq.parent_key = [], 0, 0, ROOT
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def advance(self, w: Work) -> None:
        """Record a step's work as computed and share its whole prompt segments."""
        seq = w.seq
        seq.n_computed = w.end
        self.share(seq, min(seq.n_computed, seq.n_prompt // self.segment * self.segment))

    def share(self, seq: Sequence, upto: int) -> None:
        """Put the sequence's full blocks of its first ``upto`` (computed) tokens in the prefix cache."""
        bs = self.pool.block_size
        while (seq.n_registered + 1) * bs <= upto:
            j = seq.n_registered
            key = block_key(seq.parent_key, seq.tokens[j * bs:(j + 1) * bs])
            self.pool.register(seq.blocks[j], key)
            seq.parent_key, seq.n_registered = key, j + 1

    def slot(self, seq: Sequence, pos: int) -> int:
        """The pool row of position ``pos`` of ``seq``."""
        bs = self.pool.block_size
        return seq.blocks[pos // bs] * bs + pos % bs

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def find(self, seq_id: str) -> Optional[Sequence]:
        return next((s for s in list(self.running) + list(self.waiting) if s.id == seq_id), None)
