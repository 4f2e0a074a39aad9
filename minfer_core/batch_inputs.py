"""The host side of a batched step: a scheduler's work packed into device inputs in one copy.

Block tables are rows of a fixed width (``max_blocks``, enough for a whole context), padded with
the scratch block (one block past the pool's, never handed out), so no shape depends on the
batch. Each sequence's row is kept between steps and only its new blocks are written.
"""

from __future__ import annotations

import numpy as np
import torch

from .batch_forward import Batch, bucket
from .scheduler import Sequence, Work


def upload(host: torch.Tensor, dev) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``dev`` without making the host wait for the device: through
    pinned memory, non-blocking, on a GPU (a copy from pageable memory waits for every launch queued
    before it)."""
    if torch.device(dev).type != "cuda":
        return host.to(dev)
    return host.pin_memory().to(dev, non_blocking=True)


class StepPacker:
    def __init__(self, block_size: int, scratch: int, max_blocks: int):
        self.block_size, self.scratch, self.max_blocks = block_size, scratch, max_blocks
        # one padding entry of a decode-only step: token 0 at position 0 in the scratch block
        self.padding = np.array([0, 0, scratch * block_size, 1] + [scratch] * max_blocks, dtype=np.int64)
        self._tables: dict[str, tuple[list, int, np.ndarray]] = {}  # seq id -> (block list, blocks written, row)

    def table(self, seq: Sequence) -> np.ndarray:
        """The sequence's block table as a (max_blocks,) row padded with the scratch block."""
        blocks, n, row = self._tables.get(seq.id, (None, 0, None))
        if blocks is not seq.blocks or n > len(seq.blocks):  # a new list: preempted or readmitted
            blocks, n, row = seq.blocks, 0, np.full(self.max_blocks, self.scratch, dtype=np.int64)
        if n < len(seq.blocks):
            row[n:len(seq.blocks)] = seq.blocks[n:]
        self._tables[seq.id] = (blocks, len(seq.blocks), row)
        return row

    def forget(self, seq: Sequence) -> None:
        self._tables.pop(seq.id, None)

    def slot(self, seq: Sequence, pos: int) -> int:
        return seq.blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def decode_only(self, work: list[Work]) -> np.ndarray:
        """A step whose every sequence has one row: (bucket(n), 4 + max_blocks) int64, row i for
        work i (token, position, slot, seq_len, block table), then padding entries."""
        n = len(work)
        packed = np.empty((bucket(n), self.padding.shape[0]), dtype=np.int64)
        packed[n:] = self.padding
        pos = [w.start for w in work]
        packed[:n, 0] = [w.seq.tokens[p] for w, p in zip(work, pos)]
        packed[:n, 1] = pos
        packed[:n, 2] = [self.slot(w.seq, p) for w, p in zip(work, pos)]
        packed[:n, 3] = [p + 1 for p in pos]
        packed[:n, 4:] = np.stack([self.table(w.seq) for w in work])
        return packed

    def mixed(self, work: list[Work], device) -> tuple[Batch, list[int]]:
        """Any step: every row (those at generated positions first, then those at prompt positions),
        each sequence's multi-row calls, and the single rows as paged attention entries padded to a
        bucket; the indices of the works whose logits are wanted."""
        # rows: each work's generated positions, in work order, then each work's prompt positions
        gen = [range(max(w.start, w.seq.n_prompt), w.end) for w in work]
        prompt = [range(w.start, min(w.end, w.seq.n_prompt)) for w in work]
        n_gen = sum(map(len, gen))
        first, g0, p0 = [], 0, n_gen  # each work's first row of each kind
        for g, p in zip(gen, prompt):
            first.append((g0, p0))
            g0, p0 = g0 + len(g), p0 + len(p)
        tokens, positions, slots, calls, singles, logit_rows, sampled = [], [], [], [], [], [], []
        call_tables = []
        for part in (gen, prompt):
            for w, pos in zip(work, part):
                tokens += w.seq.tokens[pos.start:pos.stop]
                positions += pos
                slots += [self.slot(w.seq, p) for p in pos]
        for k, w in enumerate(work):
            seq, (g0, p0) = w.seq, first[k]

            def row(pos: int) -> int:
                return p0 + pos - w.start if pos < seq.n_prompt else g0 + pos - max(w.start, seq.n_prompt)

            multi = [(row(a), b - a, a, len(call_tables)) for a, b in w.calls if b - a > 1]
            singles += [(row(a), a + 1, seq) for a, b in w.calls if b - a == 1]
            if multi:
                calls += multi
                call_tables.append(self.table(seq))
            if w.end == len(seq.tokens):
                logit_rows.append(row(w.end - 1))
                sampled.append(k)
        # in row order: a step of single rows only, at a bucket, is then the paged attention's entries
        # in order (PagedRows.all_single); in work order a sequence's one-row prompt call (e.g. a
        # one-token prompt recomputed after a preemption) comes before its generated rows, which
        # come first among the rows
        singles.sort(key=lambda s: s[0])
        n = len(singles)
        e = bucket(n) if n else 0
        tables = np.full((e, self.max_blocks), self.scratch, dtype=np.int64)
        for i, (_, _, seq) in enumerate(singles):
            tables[i] = self.table(seq)
        single_rows = [r for r, _, _ in singles] + [0] * (e - n)
        lens = [ln for _, ln, _ in singles] + [1] * (e - n)
        ctab = np.stack(call_tables) if call_tables else np.empty((0, self.max_blocks), dtype=np.int64)
        flat = np.concatenate([np.array(tokens + positions + slots + logit_rows + single_rows + lens
                                        + [x for c in calls for x in c], dtype=np.int64),
                               ctab.reshape(-1), tables.reshape(-1)])
        parts = torch.from_numpy(flat).to(device).split(
            [len(tokens)] * 3 + [len(logit_rows), e, e, 4 * len(calls), ctab.size, tables.size])
        batch = Batch(parts[0], parts[1], parts[2], parts[6].view(-1, 4).to(torch.int32),
                      parts[7].view(-1, self.max_blocks).to(torch.int32), max((c[1] for c in calls), default=0),
                      parts[3], parts[4], parts[8].view(e, self.max_blocks).to(torch.int32),
                      parts[5].to(torch.int32), n, n_gen)
        return batch, sampled
