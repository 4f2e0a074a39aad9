"""Load and faults against a live server: 200 concurrent streams, random disconnects, malformed
JSON, over-long prompts and queue overflow. The server must keep answering /health, every request
must end in a completion or an error, and the free KV blocks must return to their start value."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_helpers import get_json, live_server, load_engine, metric, tiny_model  # noqa: E402

N_CTX = 128
N_REQUESTS = 200
RUN_DEADLINE_S = 90
RETRY_S = 60  # how long one request keeps retrying a full queue (a slow machine drains it slowly)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("serve_load"))


async def sse_lines(resp):
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            yield line[6:]


async def one_request(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    """Send request ``i``; return its outcome. Retries on 429 (bounded), as a client honouring
    Retry-After would, but without the full wait."""
    kind = ("stream", "stream", "stream", "stream", "stream", "chat_stream", "disconnect", "malformed",
            "too_long", "plain")[i % 10]
    if kind == "malformed":
        r = await client.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": ', headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        return "malformed"
    if kind == "too_long":
        r = await client.post("/v1/completions", json={"prompt": "the " * N_CTX, "max_tokens": 4})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        return "too_long"
    chat = kind == "chat_stream"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": rng.randint(1, 8) if kind != "disconnect" else 60, "ignore_eos": True,
            "temperature": rng.choice([0.0, 0.8]), "seed": i, "stream": kind != "plain"}
    body.update({"messages": [{"role": "user", "content": f"hi {i}"}]} if chat else {"prompt": f"the {i}"})
    overflows, give_up = 0, time.monotonic() + RETRY_S
    while overflows < 1000 and time.monotonic() < give_up:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code == 429:
                err = json.loads(await r.aread())["error"]
                assert err["type"] == "rate_limit_error" and r.headers["retry-after"] == "1"
                overflows += 1
                await asyncio.sleep(min(1.0, 0.05 * 2 ** min(overflows, 5)) * (0.5 + rng.random()))  # backing off, at most about Retry-After
                continue
            assert r.status_code == 200, await r.aread()
            if kind == "plain":
                out = json.loads(await r.aread())
                assert out["choices"][0]["finish_reason"] == "length"
                assert out["usage"]["completion_tokens"] == body["max_tokens"]
                return f"done/{overflows}"
            n_chunks, finish, done = 0, None, False
            async for data in sse_lines(r):
                if kind == "disconnect" and n_chunks >= rng.randint(0, 3):
                    return f"disconnected/{overflows}"  # leaving the block closes the connection
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                assert "error" not in chunk, chunk
                n_chunks += 1
                if chunk["choices"]:
                    finish = chunk["choices"][0]["finish_reason"] or finish
            assert done and finish == "length", (kind, finish, done)
            return f"done/{overflows}"
    raise AssertionError(f"request {i} still rejected after {overflows} attempts")


async def watch_health(client: httpx.AsyncClient, stop: asyncio.Event, seen: list):
    while not stop.is_set():
        t0 = time.perf_counter()
        r = await client.get("/health")
        seen.append((r.status_code, time.perf_counter() - t0))
        await asyncio.sleep(0.05)


async def run_load(base: str) -> tuple[list[str], list]:
    rng = random.Random(0)
    limits = httpx.Limits(max_connections=N_REQUESTS + 10, max_keepalive_connections=N_REQUESTS + 10)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client, \
            httpx.AsyncClient(base_url=base, timeout=10) as health_client:
        stop, seen = asyncio.Event(), []
        watcher = asyncio.create_task(watch_health(health_client, stop, seen))
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(one_request(client, i, random.Random(rng.random())) for i in range(N_REQUESTS))),
            RUN_DEADLINE_S)
        stop.set()
        await watcher
    return outcomes, seen


def settled(base: str, deadline_s: float = 15.0) -> dict:
    t_end = time.monotonic() + deadline_s
    while True:
        status, h = get_json(base + "/health")
        if (h["inflight"], h["running"], h["queue_depth"]) == (0, 0, 0) or time.monotonic() > t_end:
            return h
        time.sleep(0.05)


def test_load_and_faults(model):
    engine = load_engine(model, n_ctx=N_CTX, parallel=8, max_queue=48)
    with live_server(engine) as (base, app):
        _, start = get_json(base + "/health")
        outcomes, seen = asyncio.run(run_load(base))
        end = settled(base)
        prom = httpx.get(base + "/metrics").text
    kinds = [o.split("/")[0] for o in outcomes]
    overflows = sum(int(o.split("/")[1]) for o in outcomes if "/" in o)
    assert len(outcomes) == N_REQUESTS
    assert kinds.count("malformed") == kinds.count("too_long") == 20 and kinds.count("disconnected") == 20
    assert kinds.count("done") == 140
    assert overflows > 0, "the queue never overflowed: the test did not exercise 429"
    assert seen and all(s == 200 for s, _ in seen) and max(t for _, t in seen) < 5.0
    assert (end["inflight"], end["running"], end["queue_depth"]) == (0, 0, 0)
    assert end["kv_blocks_free"] == start["kv_blocks_free"] == end["kv_blocks_total"]
    # every accepted request ended exactly once: 160 accepted (140 done + 20 disconnected)
    finished = {line.split('"')[1]: float(line.split()[-1]) for line in prom.splitlines()
                if line.startswith("minfer_requests_finished_total{")}
    assert sum(finished.values()) == 160, finished
    assert finished.get("length", 0) >= 140 and finished.get("cancelled", 0) + finished.get("length", 0) == 160
    assert metric(prom, "minfer_time_to_first_token_seconds_count") >= 140
    assert metric(prom, "minfer_kv_blocks_free") == end["kv_blocks_free"]


def test_disconnect_cancels_at_once(model):
    """A client leaving a long stream frees its sequence well before the stream would have ended."""
    engine = load_engine(model, n_ctx=N_CTX, parallel=2, max_queue=4)
    with live_server(engine) as (base, _):
        _, start = get_json(base + "/health")
        with httpx.Client(base_url=base, timeout=30) as c:
            with c.stream("POST", "/v1/completions",
                          json={"prompt": "the", "max_tokens": N_CTX, "ignore_eos": True, "stream": True}) as r:
                assert r.status_code == 200
                next(r.iter_lines())
        t0 = time.monotonic()
        end = settled(base)
        elapsed = time.monotonic() - t0
        prom = httpx.get(base + "/metrics").text
    assert end["kv_blocks_free"] == start["kv_blocks_free"] and end["running"] == 0
    assert 'minfer_requests_finished_total{finish_reason="cancelled"} 1.0' in prom
    assert end["tokens_generated_total"] < N_CTX - 4, "the stream ran to the context end instead of being cancelled"
    assert elapsed < 5.0


def test_engine_errors_and_plain_disconnect(model):
    """A failing forward pass ends its requests with errors (500, or an error event when
    streaming); a non-streaming client that gives up is cancelled; the pool is whole afterwards."""
    n_ctx = 512  # long enough that the abandoned request cannot finish before it is noticed
    engine = load_engine(model, n_ctx=n_ctx, parallel=2, max_queue=4)
    real_forward = engine.model.forward
    fail = {"on": False}

    def forward(*a, **kw):
        if fail["on"]:
            raise RuntimeError("injected failure")
        return real_forward(*a, **kw)

    engine.model.forward = forward
    with live_server(engine) as (base, _):
        _, start = get_json(base + "/health")
        body = {"prompt": "the", "max_tokens": 4, "ignore_eos": True}
        fail["on"] = True
        r = httpx.post(base + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "injected failure" in r.json()["error"]["message"]
        with httpx.stream("POST", base + "/v1/chat/completions", timeout=30,
                          json={"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}) as s:
            data = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
        assert data[-1] == "[DONE]" and json.loads(data[-2])["error"]["code"] == "engine_error"
        fail["on"] = False
        assert httpx.post(base + "/v1/completions", json=body, timeout=30).json()["usage"]["completion_tokens"] == 4
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a long non-streaming request
            httpx.post(base + "/v1/completions", json=dict(body, max_tokens=n_ctx), timeout=0.2)
        end = settled(base)
        prom = httpx.get(base + "/metrics").text
    assert end["kv_blocks_free"] == start["kv_blocks_free"] and end["inflight"] == 0
    assert 'minfer_requests_finished_total{finish_reason="error"} 2.0' in prom
    assert 'minfer_requests_finished_total{finish_reason="cancelled"} 1.0' in prom
    assert end["tokens_generated_total"] < 4 + n_ctx // 2, "the abandoned request ran on"
