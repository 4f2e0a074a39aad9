"""End to end on the real models, CPU reference backend: agreement with llama.cpp, generation,
chat KV reuse, sampling reproducibility, stop strings; the CLI's one-sequence engine
(``minfer_core.solo``) against ``Engine.generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minfer_core.engine import Engine
from minfer_core.perplexity import perplexity
from minfer_core.sampling import Sampler, SamplerConfig
from minfer_core.chat_session import ChatSession
from minfer_core.solo import BLOCK, generate, solo_engine

GREEDY = SamplerConfig(temp=0)
GPL3 = Path("/usr/share/common-licenses/GPL-3")


@pytest.fixture(scope="module")
def qwen(qwen_path):
    return Engine.load(qwen_path, backend="reference", device="cpu", n_ctx=1024)


@pytest.fixture(scope="module")
def smollm(smollm_path):
    return Engine.load(smollm_path, backend="reference", device="cpu", n_ctx=512)


@pytest.mark.skipif(not GPL3.exists(), reason="needs /usr/share/common-licenses/GPL-3")
def test_perplexity_within_one_percent_of_llama_cpp(qwen):
    # llama-perplexity -m qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -f <first 12,000 bytes of GPL-3> -c 512
    # gives PPL 6.1921 over 4 windows (figure from the issue, measured with llama.cpp).
    text = GPL3.read_bytes()[:12000].decode("utf-8", errors="ignore")
    res = perplexity(qwen, text, 512)
    assert res.n_windows == 4
    assert res.n_scored == 4 * 255
    assert abs(res.ppl - 6.1921) / 6.1921 < 0.01, res.ppl
    assert 0 < res.err < res.ppl


def _chat_ids(engine, user: str) -> list[int]:
    text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return engine.tok.encode(text, add_special=True, parse_special=True)


def test_greedy_qwen_answers_the_question(qwen):
    qwen.reset()
    out = qwen.generate(_chat_ids(qwen, "Write a Python function that returns the sum of a list."), 48, GREEDY)
    assert "def " in out.text and "sum" in out.text, out.text


def test_greedy_smollm_llama_arch(smollm):
    smollm.reset()
    ids = smollm.tok.encode("The capital of France is", add_special=True)
    out = smollm.generate(ids, 8, GREEDY)
    assert "Paris" in out.text, out.text


def test_incremental_decode_matches_full_forward(smollm):
    ids = smollm.tok.encode("One, two, three, four, five, six, seven, eight, nine", add_special=True)
    smollm.reset()
    full = smollm.prefill(ids, all_logits=True)
    smollm.reset()
    smollm.prefill(ids[:4])
    steps = [smollm.decode(t) for t in ids[4:]]
    for i, logits in enumerate(steps[:-1]):
        ref = full[4 + i]
        assert torch.allclose(logits, ref, atol=2e-3, rtol=1e-3), (i, (logits - ref).abs().max())


def test_chat_reuses_cache_and_equals_fresh_run(qwen):
    chat = ChatSession(solo_engine(qwen), system="You are a terse assistant.", sampling=GREEDY)
    chat.send("Name one prime number.", n_predict=16)
    first = qwen.timings.prompt_tokens
    second = chat.send("And one more?", n_predict=16)
    # the first turn's whole blocks came from the cache (the reply's too, as far as they match)
    assert first > BLOCK and qwen.last_prefill <= qwen.timings.prompt_tokens - first // BLOCK * BLOCK, \
        (first, qwen.timings.prompt_tokens, qwen.last_prefill)
    # the same conversation from an empty cache gives the same greedy reply
    chat.messages.pop()  # back to the conversation as it stood before the second reply
    fresh_ids = chat.prompt_ids()
    fresh = generate(solo_engine(qwen), fresh_ids, 16, GREEDY)
    assert qwen.last_prefill == len(fresh_ids)
    assert fresh.tokens == second.tokens


@pytest.mark.parametrize("case", ["greedy", "sampled", "stop", "length0"])
def test_solo_engine_generates_as_the_single_stream_engine(smollm, case):
    """The CLI's engine (the batched engine, one sequence, single-stream passes) gives what
    Engine.generate gives: tokens, text, stop reason."""
    ids = smollm.tok.encode("1, 2, 3, 4, 5,", add_special=True)
    sampling = SamplerConfig(temp=1.0, top_k=50, top_p=0.95, min_p=0.0, seed=7) if case == "sampled" else GREEDY
    kw = dict(n_predict=0 if case == "length0" else 12, sampling=sampling, stop=[" 7"] if case == "stop" else [])
    smollm.reset()
    want = smollm.generate(ids, **kw)
    seen, be, launched = [], solo_engine(smollm), []
    launch = be._launch_solo
    be._launch_solo = lambda w: launched.append(w.start) or launch(w)
    other = generate(be, smollm.tok.encode("Once upon a time", add_special=True), **kw)  # its blocks stay cached
    got = generate(be, ids, on_text=seen.append, **kw)
    assert (got.tokens, got.text, got.stop_reason) == (want.tokens, want.text, want.stop_reason)
    assert "".join(seen) == got.text
    assert case != "stop" or got.stop_reason == "stop"
    assert be.solo_fallbacks == 0 and other.stop_reason  # both ran from block 0 on the single-stream passes
    # greedy decode steps were launched before the last was read back (a stop string's end drops the
    # step after it); sampled ones were not, nor a request of one token
    assert bool(launched) == (case in ("greedy", "stop")), launched


def test_seed_reproduces_sampling(smollm):
    ids = smollm.tok.encode("Once upon a time", add_special=True)
    cfg = SamplerConfig(temp=1.0, top_k=50, top_p=0.95, min_p=0.0, seed=1234)
    runs = []
    for seed in (1234, 1234, 99):
        smollm.reset()
        cfg.seed = seed
        runs.append(smollm.generate(ids, 12, cfg).tokens)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_stop_string_ends_generation_and_is_not_emitted(smollm):
    smollm.reset()
    ids = smollm.tok.encode("1, 2, 3, 4, 5,", add_special=True)
    free = smollm.generate(ids, 12, GREEDY)
    assert " 7" in free.text, free.text
    smollm.reset()
    seen = []
    out = smollm.generate(ids, 12, GREEDY, stop=[" 7"], on_text=seen.append)
    assert out.stop_reason == "stop"
    assert out.text == free.text[: free.text.index(" 7")]
    assert "".join(seen) == out.text


def test_sampler_filters():
    logits = torch.tensor([5.0, 4.0, 1.0, -3.0])
    assert Sampler(SamplerConfig(temp=0))(logits) == 0
    # top_k=1 leaves only the best token, whatever the temperature and seed
    assert {Sampler(SamplerConfig(temp=5.0, top_k=1, seed=s))(logits) for s in range(20)} == {0}
    # min_p=0.5 keeps tokens with p >= 0.5 * p_max: softmax -> [0.72, 0.27, ...]: only token 0 survives
    assert {Sampler(SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=s))(logits) for s in range(20)} == {0}
    # top_p=0.9 keeps tokens 0 and 1 (0.72 < 0.9, 0.72+0.27 >= 0.9)
    picks = {Sampler(SamplerConfig(temp=1.0, top_k=0, top_p=0.9, min_p=0.0, seed=s))(logits) for s in range(200)}
    assert picks == {0, 1}
    # repeat penalty pushes a seen token below the next one
    assert Sampler(SamplerConfig(temp=0, repeat_penalty=2.0))(torch.tensor([5.0, 4.0]), history=[0]) == 1
    with pytest.raises(ValueError):
        SamplerConfig(top_p=0.0)


def test_token_ids_outside_the_vocabulary_are_refused_and_the_cache_kept(smollm):
    """An id below 0 or at / past the vocabulary (and an empty prompt) is a UserError naming it, raised
    before any kernel runs: the cache still holds the previous prompt, which decodes on as before."""
    from minfer_core.errors import UserError

    v = smollm.model.cfg.vocab_size
    ids = smollm.tok.encode("one two three", add_special=True)
    want = smollm.prefill(ids)[-1]
    for bad, shown in ((ids + [v], str(v)), ([5, -1], "-1"), ([], "empty")):
        with pytest.raises(UserError, match=shown):
            smollm.prefill(bad)
        assert smollm.cached == ids
    with pytest.raises(UserError, match=str(v + 3)):
        smollm.decode(v + 3)
    assert smollm.cached == ids
    # all but the last token come from the cache (one row re-run: float rounding of another kernel order)
    torch.testing.assert_close(smollm.prefill(ids)[-1], want, rtol=1e-4, atol=1e-3)
    assert smollm.last_prefill == 1


def test_on_text_error_cancels_and_is_raised(tiny_qwen2):
    # a closed stdout under `minfer run`/`chat`: the caller's exception comes back (as Engine.generate
    # lets it through) and the sequence is freed for the next request
    engine = Engine.load(tiny_qwen2, backend="reference", device="cpu", n_ctx=256, progress=False)
    be = solo_engine(engine)
    ids = engine.tok.encode("ab", add_special=True)

    def closed(text: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        generate(be, ids, 200, GREEDY, on_text=closed)
    assert not be.sched.running
    again = generate(be, ids, 4, GREEDY)
    assert len(again.tokens) <= 4 and again.stop_reason in ("length", "eog")


class _ByteVocab:
    """Token id -> bytes, the one method the stream decoder reads."""

    def __init__(self, pieces):
        self.pieces = pieces

    def token_bytes(self, id, special=False):
        return self.pieces[id]


@pytest.mark.parametrize("stop, want_text, want_stopped", [
    (["x\ufffd"], "", True),  # the dangling bytes flush as U+FFFD and complete the stop string
    (["\ufffd"], "x", True),
    (["y"], "x\ufffd", False),  # no stop string: the held-back text comes out, U+FFFD included
])
def test_a_stop_string_completed_by_the_final_flush_is_cut(stop, want_text, want_stopped):
    from minfer_core.engine import StopStream

    text = StopStream(_ByteVocab([b"x", b"\xe2\x82"]), stop)  # b"\xe2\x82": a euro sign's first two bytes
    shown = text.push(0) + text.push(1) + text.finish()
    assert (shown, text.stopped) == (want_text, want_stopped)
