"""The official ``openai`` client against a live ``minfer serve`` (tiny model, CPU reference)."""

from __future__ import annotations

import json
import threading

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from minfer_core.chat_template import CHATML_TEMPLATE, render_chat  # noqa: E402
from minfer_core.engine import Engine  # noqa: E402
from minfer_core.sampling import SamplerConfig  # noqa: E402

from serve_helpers import get_json, live_server, load_engine, post_raw, tiny_model  # noqa: E402

N_CTX = 256
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve_openai"))


@pytest.fixture(scope="module")
def server(model):
    with live_server(load_engine(model, n_ctx=N_CTX, parallel=4, max_queue=16)) as (base, app):
        yield base, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def single(model):
    """The single-sequence engine: the oracle for greedy text."""
    return Engine.load(model, device="cpu", backend="reference", n_ctx=N_CTX, progress=False)


def greedy_text(single, ids, n, stop=()):
    """What the single-sequence engine generates greedily, EOS ignored by never sampling it."""
    out = []
    logits = single.prefill(list(ids))[-1]
    history = list(ids)
    for _ in range(n):
        logits[sorted(single.tok.eog_ids)] = float("-inf")
        t = int(logits.argmax())
        out.append(t)
        history.append(t)
        logits = single.decode(t)
    single.reset()
    return single.tok.decode(out, special=False)


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"  # GET /v1/models/{model}, as OpenAI's API has it
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")


def test_health_answers_head(server):
    """Load balancers probe with HEAD: the status of GET, no body."""
    import httpx

    head, get = httpx.head(server[0] + "/health"), httpx.get(server[0] + "/health")
    assert head.status_code == get.status_code == 200 and head.content == b""


def test_completion_greedy_matches_single_engine(client, single):
    prompt = "the theme"
    r = client.completions.create(model="anything", prompt=prompt, max_tokens=12, temperature=0, extra_body=NO_EOS)
    ids = single.tok.encode(prompt)
    assert r.model == "tiny" and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12)
    assert r.choices[0].text == greedy_text(single, ids, 12)


def test_completion_stream_equals_non_stream(client):
    kw = dict(model="tiny", prompt="hello there", max_tokens=10, temperature=0, extra_body=NO_EOS)
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert text == whole
    assert finishes[-1] == "length" and set(finishes[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_chat(client, single):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say the"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0, extra_body=NO_EOS)
    ids = single.tok.encode(render_chat(CHATML_TEMPLATE, msgs), add_special=False)
    if single.tok.add_bos and ids[0] != single.tok.bos_id:
        ids = [single.tok.bos_id] + ids
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 8
    assert r.choices[0].message.content == greedy_text(single, ids, 8)
    stream = client.chat.completions.create(model="tiny", messages=msgs, max_completion_tokens=8, temperature=0,
                                            stream=True, extra_body=NO_EOS)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string(client):
    kw = dict(model="tiny", prompt="the", temperature=0, extra_body=NO_EOS)
    full = client.completions.create(max_tokens=16, **kw).choices[0].text
    assert len(full) >= 6
    stop = full[3:5]
    cut = full[:full.find(stop)]
    r = client.completions.create(max_tokens=16, stop=[stop, "\x00never"], **kw)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
    streamed = list(client.completions.create(max_tokens=16, stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == cut and streamed[-1].choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client):
    kw = dict(model="tiny", prompt="the", max_tokens=8, temperature=1.0, top_p=0.9, seed=1234,
              extra_body={"top_k": 50, "min_p": 0.01, "ignore_eos": True})
    a, b = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert a == b


def test_max_tokens_and_eos(client):
    r = client.completions.create(model="tiny", prompt="x", max_tokens=3, extra_body=NO_EOS)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    r = client.completions.create(model="tiny", prompt="x", max_tokens=5)  # EOS may end it early
    assert r.usage.completion_tokens <= 5 and r.choices[0].finish_reason in ("stop", "length")


def test_errors(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", n=2)
    assert e.value.status_code == 400 and e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="the " * N_CTX, max_tokens=1)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the " * N_CTX}])
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", temperature=7)
    assert e.value.param == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[10**6])
    assert e.value.param == "prompt"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="tiny", input="x")
    status, health = get_json(server[0] + "/health")
    assert status == 200 and health["status"] == "ok"


@pytest.mark.parametrize("field, value", [
    ("seed", 1 << 64), ("seed", -2), ("seed", 1.5),  # a seed torch cannot take was a 500
    ("max_tokens", True), ("max_tokens", "3"), ("stream", "yes"), ("ignore_eos", 1), ("prompt", [True, 2]),
    ("repeat_last_n", -2), ("repeat_last_n", 1.5),
])
def test_field_types_and_ranges(server, field, value):
    """JSON's own integers and booleans only, and seeds in range: each else is a 400 naming the field."""
    body = {"model": "tiny", "prompt": "x", "max_tokens": 1, field: value}
    status, reply = post_raw(server[0] + "/v1/completions", json.dumps(body).encode())
    assert status == 400 and reply["error"]["param"] == field, reply


def test_hostile_bodies(server):
    """Nesting that overflows the JSON parser's recursion is a 400 (it was a 500), a body over the
    context's budget a 413 before it is parsed or tokenized, a lone surrogate a 400; the server
    answers /health after."""
    base = server[0]
    status, reply = post_raw(base + "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "nested too deeply" in reply["error"]["message"]
    huge = json.dumps({"model": "tiny", "prompt": "x" * (2 << 20), "max_tokens": 1}).encode()
    status, reply = post_raw(base + "/v1/completions", huge)
    assert status == 413 and reply["error"]["code"] == "request_too_large"
    # half a UTF-16 pair, escaped: the tokenizer raised on it (a 500), as did echoing it back
    for path, body in [("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 1}'),
                       ("/v1/completions", b'{"prompt": "a", "max_tokens": 1, "stop": ["\\udfff"]}'),
                       ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}')]:
        status, reply = post_raw(base + path, body)
        assert status == 400 and "surrogate" in reply["error"]["message"], (body, reply)
    assert get_json(base + "/health")[0] == 200


def test_health_answers_while_a_prompt_is_tokenized(model):
    """A long prompt is tokenized off the event loop: a request stuck in the tokenizer holds
    nothing else up (it then gets its answer: too long for the context)."""
    with live_server(load_engine(model, n_ctx=N_CTX, parallel=1, max_queue=2)) as (base, app):
        tok, entered, release = app.state.runner.engine.tok, threading.Event(), threading.Event()
        encode = tok.encode

        def slow_encode(*a, **kw):
            entered.set()
            release.wait(30)
            return encode(*a, **kw)

        tok.encode = slow_encode
        done = []
        body = json.dumps({"model": "tiny", "prompt": "hello " * 4000, "max_tokens": 1}).encode()
        t = threading.Thread(target=lambda: done.append(post_raw(base + "/v1/completions", body)))
        t.start()
        try:
            assert entered.wait(10)
            assert get_json(base + "/health")[0] == 200  # get_json gives up after 10 s
            assert not done
        finally:
            release.set()
            t.join(30)
        assert done and done[0][1]["error"]["code"] == "context_length_exceeded"


def test_chat_without_template(model):
    with live_server(load_engine(model, n_ctx=N_CTX, parallel=1, max_queue=1), template=None) as (base, _):
        c = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert "chat template" in e.value.message
        assert c.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body=NO_EOS).usage.completion_tokens == 2


def test_sampler_mapping():
    from minfer_core.server.protocol import CompletionRequest

    s = CompletionRequest(prompt="x", temperature=0.5, top_p=0.8, top_k=7, min_p=0.1, seed=3).sampler()
    assert s == SamplerConfig(temp=0.5, top_k=7, top_p=0.8, min_p=0.1, repeat_penalty=1.0, seed=3)
    assert CompletionRequest(prompt="x", top_p=0).sampler().greedy


def test_repeat_last_n_sets_the_penalty_window():
    """llama-server takes ``repeat_last_n`` as the repeat penalty's window (tools/server/server-schema.cpp,
    make_llama_cmpl_schema: field "repeat_last_n" -> sampling.penalty_last_n, default 64 from common.h's
    common_params_sampling). It was dropped as an unknown field: the window stayed 64 whatever was sent."""
    from minfer_core.server.protocol import ChatCompletionRequest, CompletionRequest

    assert CompletionRequest(prompt="x", repeat_penalty=1.3, repeat_last_n=256).sampler().repeat_last_n == 256
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], repeat_penalty=1.3, repeat_last_n=0)
    assert chat.sampler().repeat_last_n == 0
    assert CompletionRequest(prompt="x").sampler().repeat_last_n == 64


def test_loadgen_against_the_server(server, capsys):
    """benchmarks/loadgen.py runs its levels against a live server and prints one row each, with
    every request's tokens counted from its usage chunk."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "loadgen.py"
    spec = importlib.util.spec_from_file_location("loadgen", path)
    loadgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadgen)
    assert loadgen.main(["--url", server[0], "-c", "1,3", "-n", "5", "--requests", "6"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[1:-1] for line in out if line.startswith("| ")]
    assert [(int(r[0]), int(r[1])) for r in rows[1:]] == [(1, 6), (3, 6)]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows[1:])
