"""Paged KV cache bookkeeping: fixed-size blocks, refcounts, and a prefix cache of full blocks.

The storage itself is :class:`minfer_core.model.KVCache` (per layer ``(n_blocks * block_size, Hkv,
D)``, seen as ``(n_blocks, block_size, Hkv, D)``); this module only decides which block holds what.
A full block computed from a prompt is keyed by a SHA-256 digest of its parent's key and its token
ids, so a block is found only after the same tokens at the same positions: a request cannot craft a
prompt whose key matches another's prefix, as it could with Python's ``hash`` (not collision-resistant).
A block whose last user lets go stays findable (least recently used first out) until an allocation
needs its memory.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import OrderedDict
from typing import Optional, Sequence

ROOT = b""  # the parent key of a sequence's first block


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: the SHA-256 digest of its parent's key and its own token
    ids (as 64-bit integers), so equal keys mean equal prefixes."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class BlockPool:
    """``n_blocks`` blocks of ``block_size`` token rows each, handed out by id.

    ``allocate`` takes the lowest-numbered never-cached free block first (so a lone sequence holds
    blocks 0, 1, 2, ...: the contiguous cache, see ``BatchEngine(solo=True)``), then evicts the least
    recently used cached block; with ``lowest_first`` it takes the lowest-numbered block that is free
    or cached but unused (a lone sequence then always starts at block 0). ``free`` drops one
    reference; at zero a cached block goes to the LRU list, any other back to the free list.
    ``n_free`` counts both (a cached block with no user is reclaimable).
    """

    def __init__(self, n_blocks: int, block_size: int, lowest_first: bool = False):
        if n_blocks < 1 or block_size < 1:
            raise ValueError("the KV pool needs at least one block of at least one row")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.lowest_first = lowest_first  # evict a cached block rather than take a higher free one
        self.free_ids: list[int] = list(range(n_blocks))  # a heap: the lowest id first
        self.refs = [0] * n_blocks
        self.key_of: dict[int, bytes] = {}
        self.by_key: dict[bytes, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody uses, oldest first
        self.hits = 0  # blocks served from the prefix cache

    @property
    def n_free(self) -> int:
        return len(self.free_ids) + len(self.lru)

    @property
    def n_used(self) -> int:
        return self.n_blocks - self.n_free

    def allocate(self) -> Optional[int]:
        """A block with one reference, or None when every block is in use."""
        if self.lowest_first and self.lru and (not self.free_ids or min(self.lru) < self.free_ids[0]):
            b = min(self.lru)
            del self.lru[b]
            del self.by_key[self.key_of.pop(b)]
        elif self.free_ids:
            b = heapq.heappop(self.free_ids)
        elif self.lru:
            b, _ = self.lru.popitem(last=False)
            del self.by_key[self.key_of.pop(b)]
        else:
            return None
        self.refs[b] = 1
        return b

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block (a sequence finished, was cancelled or preempted)."""
        for b in blocks:
            if self.refs[b] <= 0:
                raise RuntimeError(f"KV block {b} freed more often than taken")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.key_of:
                    self.lru[b] = None
                else:
                    heapq.heappush(self.free_ids, b)

    def drop(self, block: int) -> None:
        """Take a cached block nobody uses out of the prefix cache, back to the free list (its rows are
        about to be overwritten); any other block is left as it is."""
        if self.refs[block] == 0 and block in self.key_of:
            del self.lru[block]
            del self.by_key[self.key_of.pop(block)]
            heapq.heappush(self.free_ids, block)

    def lookup(self, key: bytes) -> Optional[int]:
        """The cached block for ``key`` with one more reference, or None."""
        b = self.by_key.get(key)
        if b is None:
            return None
        if self.refs[b] == 0:
            del self.lru[b]
        self.refs[b] += 1
        self.hits += 1
        return b

    def register(self, block: int, key: bytes) -> None:
        """Make a full, computed block findable by ``key`` (a block already cached under ``key``
        stays the one found; ``block`` then stays private to its sequence)."""
        if key not in self.by_key and block not in self.key_of:
            self.by_key[key] = block
            self.key_of[block] = key

    def match(self, tokens: Sequence[int], max_blocks: int) -> list[int]:
        """Take (with a reference each) the cached blocks holding the longest prefix of ``tokens``,
        at most ``max_blocks`` of them."""
        out: list[int] = []
        parent, bs = ROOT, self.block_size
        while len(out) < max_blocks and (len(out) + 1) * bs <= len(tokens):
            key = block_key(parent, tokens[len(out) * bs:(len(out) + 1) * bs])
            b = self.lookup(key)
            if b is None:
                break
            out.append(b)
            parent = key
        return out
