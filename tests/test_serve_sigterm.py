"""SIGTERM on a ``minfer serve`` subprocess with streams in flight: new requests get 503, every
stream ends with a finish or an error event, and the process exits 0 within the deadline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from serve_helpers import tiny_model  # noqa: E402

SHUTDOWN_S = 2.5
N_CTX = 2048  # the long stream cannot reach it within the deadline
ROOT = Path(__file__).parent.parent


def start_server(model: Path, *extra: str):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "minfer_core.cli", "serve", "-m", str(model), "--port", "0", "--device", "cpu",
           "--backend", "reference", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end and proc.poll() is None:
        url = next((m.group(1) for ln in lines if (m := re.search(r"at (http://127\.0\.0\.1:\d+)/v1", ln))), None)
        if url:
            return proc, url, lines
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines))


def read_stream(url: str, body: dict, started: threading.Event, out: list) -> None:
    """Record how the stream ended: 'finish:<reason>', 'error:<code>' (each followed by [DONE]),
    or 'broken:<...>' if it ended otherwise."""
    events = []
    try:
        with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                started.set()
                events.append(line[6:])
    except Exception as e:  # noqa: BLE001 - recorded and asserted on below
        out.append(f"broken:{type(e).__name__}")
        started.set()
        return
    if len(events) >= 2 and events[-1] == "[DONE]":
        last = json.loads(events[-2])
        if "error" in last:
            out.append(f"error:{last['error']['code']}")
            return
        if last["choices"][0]["finish_reason"]:
            out.append(f"finish:{last['choices'][0]['finish_reason']}")
            return
    out.append(f"broken:{events[-2:]}")


def test_sigterm_drains_and_exits_zero(tmp_path):
    """Two running streams (one finishes within the deadline, one cannot) and one queued."""
    proc, url, log = start_server(tiny_model(tmp_path, n_ctx=N_CTX), "-c", str(N_CTX), "--parallel", "2",
                                  "--max-queue", "4", "--shutdown-timeout", str(SHUTDOWN_S))
    try:
        assert httpx.get(url + "/health").json()["status"] == "ok"
        ends: dict[str, list] = {"long": [], "short": [], "queued": []}
        threads = {}

        def launch(name, max_tokens):
            started = threading.Event()
            body = {"prompt": "the", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
            threads[name] = threading.Thread(target=read_stream, args=(url, body, started, ends[name]), daemon=True)
            threads[name].start()
            return started

        long_, short = launch("long", N_CTX - 8), launch("short", 150)
        assert long_.wait(30) and short.wait(30), "the streams never started"
        launch("queued", N_CTX - 8)  # runs once "short" ends, then is cut by the deadline
        t_end = time.monotonic() + 10
        while httpx.get(url + "/health").json()["queue_depth"] < 1:
            assert time.monotonic() < t_end, "the third request never reached the queue"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert httpx.get(url + "/health").status_code == 503
        rc = proc.wait(SHUTDOWN_S + 20)
        elapsed = time.monotonic() - t0
        for t in threads.values():
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(log)
    assert rc == 0, text
    assert elapsed < SHUTDOWN_S + 10, elapsed
    assert "draining (3 in flight" in text
    assert ends == {"long": ["error:cancelled"], "short": ["finish:length"], "queued": ["error:cancelled"]}, text
    assert "KV pool" in text or "KV blocks" in text, "the memory plan was not printed"
    assert "server stopped" in text
