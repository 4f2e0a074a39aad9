"""``minfer serve`` at its edges: admission under ``--max-queue``, bodies that parse to no valid
request (non-finite numbers, huge integers, nulls), HTTP details (405's Allow, one ``created`` a
stream, SSE lines any splitter keeps whole), and work kept off the event loop. Each test states what
a client, OpenAI's docs, HTTP or the --help text expects."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from minfer_core.batch_engine import QueueFull, Request  # noqa: E402

from serve_helpers import live_server, load_engine, post_raw, tiny_model  # noqa: E402

N_CTX = 128


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve_edges"))


@pytest.fixture(scope="module")
def server(model):
    with live_server(load_engine(model, n_ctx=N_CTX, parallel=2, max_queue=8)) as (base, app):
        yield base, app


def req(n: int = 1) -> Request:
    return Request(prompt_ids=[1, 2, 3], max_tokens=n, ignore_eos=True)


# -- admission (--max-queue) -------------------------------------------------------------------
# BatchEngine.submit used to refuse when `_n_waiting + len(_incoming) >= max_queue`: requests not
# yet drained into the scheduler counted as waiting even when a slot was free for them, and
# _n_waiting was a snapshot taken at the end of each step, so requests drained at a step's start
# were not counted until it ended.

def test_max_queue_zero_still_admits_up_to_parallel(model):
    engine = load_engine(model, n_ctx=N_CTX, parallel=2, max_queue=0)
    engine.submit(req())  # help: "requests waiting beyond --parallel before new ones get 429"


def test_burst_fills_free_slots_then_the_queue(model):
    engine = load_engine(model, n_ctx=N_CTX, parallel=2, max_queue=1)
    for _ in range(3):  # 2 run, 1 waits: nothing to refuse (no step ran between the submits)
        engine.submit(req())
    with pytest.raises(QueueFull):
        engine.submit(req())


def test_queue_bound_holds_while_a_step_runs(model):
    engine = load_engine(model, n_ctx=N_CTX, parallel=1, max_queue=1)
    engine.submit(req(50))
    engine.step()  # A runs
    engine.submit(req(50))  # B: the queue (1) is full from here on
    seen = {}
    run = engine._run

    def run_and_submit(work, checked=False):  # a request arriving while the step computes
        seen["depth"] = engine.stats()["queue_depth"]
        try:
            engine.submit(req())
            seen["admitted"] = True
        except QueueFull:
            seen["admitted"] = False
        return run(work, checked)

    engine._run = run_and_submit
    engine.step()  # drains B into the waiting queue, then runs A's step
    assert seen == {"depth": 1, "admitted": False}


# -- request bodies ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b'"repeat_penalty": 1e999', b'"repeat_penalty": Infinity',
                                 b'"temperature": 0.5, "repeat_penalty": 1e400'])
def test_non_finite_numbers_are_400(server, raw):
    """1e999 is valid JSON (it parses to inf); Infinity / NaN are not JSON at all but json.loads
    takes them."""
    status, reply = post_raw_text(server[0] + "/v1/completions", b'{"prompt": "the", "max_tokens": 1, ' + raw + b"}")
    assert status == 400, reply


def test_huge_integer_literal_is_400(server):
    status, reply = post_raw_text(server[0] + "/v1/completions",
                                  b'{"prompt": "the", "max_tokens": ' + b"1" * 5000 + b"}")
    assert status == 400, reply


def test_null_fields_take_their_defaults(server):
    """OpenAI's schema marks these nullable; the openai client sends null for a None argument
    (`temperature=cfg.get("temperature")`); llama-server and vLLM read null as the default."""
    c = openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                  temperature=None, top_p=None, n=None, stream=None, presence_penalty=None,
                                  frequency_penalty=None, stop=None, seed=None)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("extra, n_tokens", [({"n_predict": 3}, 3), ({"n_predict": 3, "max_tokens": 2}, 2),
                                             ({"n_predict": -1}, N_CTX - 3)])
def test_n_predict_is_llama_servers_name_for_max_tokens(server, extra, n_tokens):
    """llama-server reads ``n_predict`` (-1: until prompt and completion fill the context) where
    ``max_tokens`` is not given."""
    r = httpx.post(server[0] + "/v1/completions", timeout=120,
                   json={"prompt": [1, 2, 3], "ignore_eos": True, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n_tokens


def test_n_predict_zero_is_400(server):
    status, reply = post_raw_text(server[0] + "/v1/completions", b'{"prompt": "the", "n_predict": 0}')
    assert status == 400 and "n_predict" in reply, reply


# -- HTTP --------------------------------------------------------------------------------------

def test_405_names_the_allowed_methods(server):
    r = httpx.get(server[0] + "/v1/completions")
    assert r.status_code == 405 and r.headers.get("allow") == "POST"


def test_stream_chunks_share_one_created(model):
    """OpenAI: 'Each chunk has the same timestamp.'"""
    engine = load_engine(model, n_ctx=N_CTX, parallel=1, max_queue=2)
    accept = engine._accept

    def slow_accept(*a, **kw):  # a stream that spans a second boundary
        time.sleep(0.4)
        return accept(*a, **kw)

    engine._accept = slow_accept
    with live_server(engine) as (base, _):
        with httpx.stream("POST", base + "/v1/completions", timeout=60,
                          json={"prompt": "the", "max_tokens": 5, "ignore_eos": True, "stream": True}) as r:
            created = {json.loads(ln[6:])["created"] for ln in r.iter_lines()
                       if ln.startswith("data: {")}
    assert len(created) == 1, created


def test_sse_lines_survive_splitlines():
    """httpx's iter_lines / aiter_lines (benchmarks/loadgen.py, the tests) split like
    str.splitlines: a raw U+2028 in a chunk's text cuts its JSON in two."""
    from minfer_core.server import protocol as P
    from minfer_core.server.app import sse

    lines = [ln for ln in sse(P.chunk("cmpl-1", "m", False, text="a\u2028b\u2029c\x85d")).splitlines() if ln]
    assert len(lines) == 1 and json.loads(lines[0][6:])["choices"][0]["text"] == "a\u2028b\u2029c\x85d"


def test_many_short_messages_are_tokenized_off_the_loop(model):
    """off_loop sized a chat by its messages' text only: 20,000 empty messages (a 340 KB body)
    rendered and tokenized on the event loop, where they held up every stream and /health."""
    with live_server(load_engine(model, n_ctx=N_CTX, parallel=1, max_queue=2)) as (base, app):
        tok, entered = app.state.runner.engine.tok, threading.Event()
        encode = tok.encode

        def slow_encode(*a, **kw):
            entered.set()
            time.sleep(3)  # a long render + tokenize
            return encode(*a, **kw)

        tok.encode = slow_encode
        body = json.dumps({"messages": [{"role": "user"}] * 20000, "max_tokens": 1}).encode()
        t = threading.Thread(target=post_raw, args=(base + "/v1/chat/completions", body))
        t.start()
        try:
            assert entered.wait(10)
            t0 = time.monotonic()
            httpx.get(base + "/health", timeout=10)
            waited = time.monotonic() - t0
        finally:
            t.join(30)
        assert waited < 1.0, f"/health waited {waited:.1f} s behind a chat's tokenizer"


def test_client_leaving_mid_body_is_not_an_error(server, caplog):
    base = server[0]
    port = int(base.rsplit(":", 1)[1])
    with caplog.at_level(logging.ERROR):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\"")
        time.sleep(0.3)
        s.close()
        time.sleep(0.5)
        assert httpx.get(base + "/health").status_code == 200
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]


def test_unexpected_error_is_an_openai_500_and_counted(server, monkeypatch):
    """A fault of the server's own is a 500 with OpenAI's error body, counted in
    minfer_requests_rejected_total like every other error status."""
    base, app = server

    def boom():
        raise RuntimeError("injected")

    before = rejected(base, "500")
    with monkeypatch.context() as m:
        m.setattr(app.state.runner.engine, "stats", boom)
        r = httpx.get(base + "/health")
    err = r.json()["error"]
    assert r.status_code == 500 and err["type"] == "server_error" and set(err) == {"message", "type", "param", "code"}
    assert rejected(base, "500") == before + 1


def rejected(base: str, status: str) -> float:
    """minfer_requests_rejected_total for ``status`` (0 before the first)."""
    sample = f'minfer_requests_rejected_total{{status="{status}"}} '
    text = httpx.get(base + "/metrics").text
    return next((float(ln[len(sample):]) for ln in text.splitlines() if ln.startswith(sample)), 0.0)


def post_raw_text(url: str, data: bytes) -> tuple[int, str]:
    """POST ``data`` as is; the status and the reply's text (JSON or not)."""
    r = httpx.post(url, content=data, headers={"Content-Type": "application/json"}, timeout=30)
    return r.status_code, r.text
