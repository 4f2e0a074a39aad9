"""Block pool bookkeeping: allocation order, refcounts, the prefix cache and its LRU eviction."""

from __future__ import annotations

import pytest

from minfer_core.kv_pages import ROOT, BlockPool, block_key


def fill(pool: BlockPool, tokens: list[int]) -> list[int]:
    """Allocate blocks for ``tokens`` and register every full one, as a finished prompt would."""
    blocks, parent = [], ROOT
    for j in range(len(tokens) // pool.block_size):
        b = pool.allocate()
        key = block_key(parent, tokens[j * pool.block_size:(j + 1) * pool.block_size])
        pool.register(b, key)
        blocks.append(b)
        parent = key
    return blocks


def test_allocation_from_block_zero_and_exhaustion():
    pool = BlockPool(4, 2)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]  # one sequence: contiguous from 0
    assert pool.allocate() is None and pool.n_free == 0
    pool.free([1, 2])
    assert pool.n_free == 2 and pool.n_used == 2
    with pytest.raises(RuntimeError):
        pool.free([1])


def test_prefix_blocks_are_shared_and_counted():
    pool = BlockPool(8, 2)
    a = fill(pool, [1, 2, 3, 4, 5, 6])
    hit = pool.match([1, 2, 3, 4, 9, 9, 9], max_blocks=10)
    assert hit == a[:2] and pool.hits == 2
    assert pool.refs[a[0]] == 2 and pool.refs[a[2]] == 1
    assert pool.match([1, 2, 3, 4], max_blocks=1) == a[:1]  # the cap holds
    assert pool.match([2, 1, 3, 4], max_blocks=4) == []  # same tokens elsewhere: no hit
    pool.free(a)
    pool.free(hit)
    pool.free(a[:1])
    assert pool.n_free == 8 and all(r == 0 for r in pool.refs)


def test_freed_cached_blocks_stay_until_needed_lru_first():
    pool = BlockPool(3, 1)
    old, new = fill(pool, [7]), fill(pool, [8])
    pool.free(old)
    pool.free(new)
    assert pool.n_free == 3
    b = pool.allocate()  # the never-cached block goes first
    assert b not in old + new
    assert pool.match([8], 1) == new  # a hit takes a cached block out of the LRU list
    pool.free(new)  # now [7] is the least recently used
    assert pool.allocate() == old[0]
    assert pool.match([7], 1) == [] and pool.match([8], 1) == new


def test_duplicate_registration_keeps_the_first_block():
    pool = BlockPool(4, 2)
    first, second = fill(pool, [1, 2]), fill(pool, [1, 2])
    assert pool.match([1, 2], 1) == first
    pool.free(second)
    assert pool.refs[second[0]] == 0 and second[0] in pool.free_ids  # private: straight back


def test_lowest_free_block_first_and_lowest_first_evicts():
    """The pool hands out the lowest free block (freed ones come back in order); with ``lowest_first``
    (a solo engine) a cached block nobody uses is taken before any higher free one, so a new sequence
    starts at block 0 whatever the cache holds."""
    pool = BlockPool(6, 2)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    pool.free([3, 1])
    assert [pool.allocate(), pool.allocate(), pool.allocate()] == [1, 3, 4]

    solo = BlockPool(6, 2, lowest_first=True)
    first = fill(solo, [1, 2, 3, 4, 5, 6])  # blocks 0, 1, 2, cached
    solo.free(first)
    assert solo.allocate() == 0 and solo.match([1, 2, 3, 4], 2) == []  # block 0 evicted: its chain is gone
    assert [solo.allocate(), solo.allocate()] == [1, 2]
    plain = BlockPool(6, 2)
    plain.free(fill(plain, [1, 2, 3, 4, 5, 6]))
    assert plain.allocate() == 3  # the default keeps cached blocks while free ones last


def test_a_hit_needs_the_whole_prefix_not_an_equal_hash(monkeypatch):
    """A prompt crafted so that its first block's key hashes like another prompt's (Python's ``hash``
    is not collision-resistant; here every hash collides) must not be served that prompt's later
    blocks: its last block sits after other tokens."""
    import minfer_core.kv_pages as kv_pages

    monkeypatch.setattr(kv_pages, "hash", lambda _: 0, raising=False)
    pool = BlockPool(8, 2)
    victim = fill(pool, [1, 2, 3, 4])
    assert pool.match([1, 2, 3, 4], max_blocks=4) == victim  # the same prefix is found
    own = fill(pool, [7, 7])  # the other prompt's first block, cached by an earlier request of its own
    assert pool.match([7, 7, 3, 4], max_blocks=4) == own  # [3, 4] after [7, 7]: not the victim's block
