"""Continuous batching decisions, without a model: which tokens run, in which attention calls,
admission, the token budget, and preemption of the youngest sequence when blocks run out."""

from __future__ import annotations

import pytest

from minfer_core.kv_pages import BlockPool
from minfer_core.scheduler import Scheduler, Sequence


def seq(i: int, n: int) -> Sequence:
    return Sequence(f"s{i}", list(range(100 * i, 100 * i + n)), n, order=i)


def step(s: Scheduler, sample: bool = True) -> list:
    """Schedule, record the work as computed, and append a token to every finished prompt."""
    work = s.schedule()
    for w in work:
        s.advance(w)
        if sample and w.end == len(w.seq.tokens):
            w.seq.tokens.append(1)
    return work


def test_calls_follow_segments_then_single_tokens():
    s = Scheduler(BlockPool(64, 4), parallel=4, segment=8, step_tokens=64)
    a = seq(0, 21)
    s.add(a)
    assert [w.calls for w in step(s)] == [[(0, 8), (8, 16), (16, 21)]]
    assert [w.calls for w in step(s)] == [[(21, 22)]]
    a.n_computed = 0  # as after a preemption: the prompt in segments, generated tokens one by one
    a.tokens += [2, 3]
    assert [w.calls for w in step(s)] == [[(0, 8), (8, 16), (16, 21), (21, 22), (22, 23), (23, 24), (24, 25)]]


def test_budget_decodes_first_and_chunks_prompts():
    s = Scheduler(BlockPool(64, 4), parallel=4, segment=8, step_tokens=10)
    a, b = seq(0, 5), seq(1, 30)
    s.add(a)
    step(s)  # a's prompt
    s.add(b)
    work = step(s)
    assert [(w.seq.id, w.calls) for w in work] == [("s0", [(5, 6)]), ("s1", [(0, 8)])]
    work = step(s)
    assert [(w.seq.id, w.calls) for w in work] == [("s0", [(6, 7)]), ("s1", [(8, 16)])]


def test_parallel_limit_and_admission():
    s = Scheduler(BlockPool(64, 4), parallel=2, segment=4, step_tokens=64)
    for i in range(3):
        s.add(seq(i, 4))
    step(s)
    assert [q.id for q in s.running] == ["s0", "s1"] and [q.id for q in s.waiting] == ["s2"]
    s.remove(s.running[0])
    step(s)
    assert [q.id for q in s.running] == ["s1", "s2"]


def test_youngest_is_preempted_and_requeued_first():
    pool = BlockPool(6, 4)
    s = Scheduler(pool, parallel=3, segment=4, step_tokens=64)
    a, b, c = seq(0, 8), seq(1, 8), seq(2, 4)
    for q in (a, b, c):
        s.add(q)
    step(s)  # 2 + 2 + 1 blocks
    assert pool.n_free == 1
    for _ in range(4):  # a and b each need a third block after 4 tokens; c its second
        step(s)
    assert s.preemptions >= 1
    assert s.running[0] is a and c not in s.running and s.waiting[0] is c
    assert c.blocks == [] and c.n_computed == 0 and len(c.tokens) > 4  # kept its generated tokens
    assert pool.n_free + sum(len(q.blocks) for q in s.running) == pool.n_blocks


def test_prefix_hit_is_whole_segments_and_leaves_a_token():
    pool = BlockPool(32, 4)
    s = Scheduler(pool, parallel=4, segment=8, step_tokens=64)
    a = seq(0, 20)
    s.add(a)
    step(s, sample=False)
    s.remove(a)  # blocks of [0, 16) stay cached; [16, 20) is not a whole segment
    b = Sequence("b", a.tokens[:20] + [5, 6], 22, order=1)
    s.add(b)
    assert step(s)[0].calls[0][0] == 16 and pool.hits == 4
    c = Sequence("c", a.tokens[:16], 16, order=2)  # all cached: one segment is recomputed for logits
    s.add(c)
    assert [w.calls for w in step(s) if w.seq is c] == [[(8, 16)]]


def test_bad_settings():
    with pytest.raises(ValueError):
        Scheduler(BlockPool(4, 4), parallel=1, segment=6, step_tokens=64)
    with pytest.raises(ValueError):
        Scheduler(BlockPool(4, 4), parallel=1, segment=8, step_tokens=4)



def test_sequences_are_compared_by_identity():
    """A sequence is its own object: two with equal fields are distinct (and membership in the
    running list costs an identity test, not a generated field-by-field comparison, which made
    scheduling 128 sequences ~10 ms of host time a step)."""
    s = Scheduler(BlockPool(64, 4), parallel=4, segment=8, step_tokens=64)
    a, b = seq(0, 5), seq(0, 5)
    assert a is not b and a != b
    s.add(a)
    step(s)
    s.remove(b)  # not running, not waiting: only b's (empty) blocks are freed
    assert s.running == [a] and a.blocks


def test_a_prompt_that_cannot_fit_yet_waits_instead_of_preempting_itself_each_step():
    """A long prompt beside a decoding sequence, in a pool too small for both: it runs the calls the
    free blocks hold, and once they are gone waits in the queue. Planning every call of the prompt at
    once made each step preempt the prompt's own sequence (the youngest), over and over, with nothing
    computed."""
    s = Scheduler(BlockPool(8, 2), parallel=2, segment=2, step_tokens=64)
    a, b = seq(0, 2), seq(1, 16)  # a: 1 block, b: 8 blocks, more than the 7 left
    s.add(a)
    step(s)
    s.add(b)
    computed, a_blocks = [], len(a.blocks)
    for _ in range(6):  # a decodes 6 tokens
        step(s)
        computed.append(b.n_computed)
    # b gives its blocks back only when a's growth needs one (3 blocks over the 6 tokens), not every step
    assert s.preemptions <= len(a.blocks) - a_blocks == 3, s.preemptions
    assert max(computed) > 0  # b ran what the free blocks held
    assert a.n_computed == len(a.tokens) - 1 == 8  # a never waited
