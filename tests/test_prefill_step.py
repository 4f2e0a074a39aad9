"""The whole-prompt prefill step a plugin may wrap (CUDA graphs): bucket lengths, and padding that
changes nothing. Oracle: the plain, unpadded forward of the same model (reference backend)."""

from __future__ import annotations

import pytest
import torch

from minfer_core.engine import Engine, prompt_bucket


@pytest.mark.parametrize("n,want", [(16, 16), (17, 32), (100, 112), (128, 128), (512, 512), (513, 576),
                                    (3314, 3328), (4096, 4096)])
def test_bucket_lengths(n, want):
    assert prompt_bucket(n) == want


def test_bucket_padding_is_bounded():
    for n in range(16, 9000):
        b = prompt_bucket(n)
        assert n <= b <= n + max(15, n // 8)
    assert len({prompt_bucket(n) for n in range(1025, 2049)}) == 8  # 1152, 1280, ..., 2048


@pytest.fixture(scope="module")
def engine(tiny_qwen2):
    return Engine.load(tiny_qwen2, backend="reference", device="cpu", n_ctx=128, progress=False)


def test_padded_prefill_step_equals_the_forward(engine):
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0))
    want = engine.model.prompt(ids, 0)
    padded = torch.cat([ids, torch.zeros(prompt_bucket(40) - 40, dtype=torch.long)])
    got = engine.model.prefill_step(padded, torch.tensor([39]))
    assert got.shape == want.shape == (1, engine.cfg.vocab_size)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), float((got - want).abs().max())


def test_engine_pads_through_a_wrapper_and_decodes_as_unpadded(engine):
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    engine.reset()
    want = engine.prefill(ids).clone()  # no wrapper: the plain forward
    d_want = [engine.decode(t).clone() for t in (5, 6)]
    calls = []

    def wrapper(tokens, last):
        calls.append((tokens.shape[0], int(last)))
        return engine.model.prefill_step(tokens, last)

    engine.prefill_step = wrapper
    try:
        engine.reset()
        got = engine.prefill(ids)
        d_got = [engine.decode(t) for t in (5, 6)]
        engine.prefill(ids + [5, 6, 9])  # a continuation reuses the cache: plain forward, no wrapper
        engine.reset()
        engine.prefill(ids[:10])  # under 16 tokens: plain forward
    finally:
        engine.prefill_step = None
    assert calls == [(48, 39)]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(d_got, d_want):  # the padding's K/V rows never reach a later token
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)



def test_solo_engine_pads_over_cached_blocks_and_keeps_the_cache_sound(engine):
    """The CLI's engine runs a prompt's padded prefill step over the rows after its own blocks even
    when an earlier request left them cached (they are dropped from the prefix cache first), and the
    tokens stay the single stream's."""
    from minfer_core.sampling import SamplerConfig
    from minfer_core.solo import generate, solo_engine

    greedy = SamplerConfig(temp=0)
    eng = Engine.load(engine.path, backend="reference", device="cpu", n_ctx=512, progress=False)
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, 256, (300,), generator=gen).tolist()
    b = torch.randint(0, 256, (260,), generator=gen).tolist()  # 17 blocks, padded to 288 rows: block 17 too
    want = []
    for ids in (a, b, a):
        eng.reset()
        want.append(eng.generate(ids, 12, greedy).tokens)
    be = solo_engine(eng)
    calls, cached_17 = [], []

    def wrapper(tokens, last):
        calls.append(tokens.shape[0])
        cached_17.append(17 in be.pool.key_of)
        return eng.model.prefill_step(tokens, last)

    first = generate(be, a, 12, greedy).tokens
    assert 17 in be.pool.key_of  # a left blocks 0..19 cached (311 rows computed)
    eng.prefill_step = wrapper
    got = [first] + [generate(be, ids, 12, greedy).tokens for ids in (b, a)]
    # b took blocks 0..16 (evicting a's) and its padding block 17, dropped from the cache before the
    # step; a again finds none of its blocks (block 0 is b's) and runs from scratch
    assert calls == [288, 320] and cached_17 == [False, False]
    assert got == want and be.solo_fallbacks == 0
