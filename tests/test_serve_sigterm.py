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

SHUTDOWN_S = 1.0
TESTS = Path(__file__).parent
LAUNCH = "import sys, serve_fake; serve_fake.install(); from minfer_core.cli import main; sys.exit(main(sys.argv[1:]))"


def start_server(model: Path, *extra: str):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-c", LAUNCH, "serve", "-m", str(model), "--port", "0", "-c", "256", "--device", "cpu",
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
    proc, url, log = start_server(tiny_model(tmp_path), "--parallel", "1", "--max-queue", "4",
                                  "--shutdown-timeout", str(SHUTDOWN_S))
    try:
        assert httpx.get(url + "/health").json()["status"] == "ok"
        ends: list[str] = []
        threads, flags = [], []
        for max_tokens in (240, 240, 2):  # parallel 1: the later ones wait in the queue
            flags.append(threading.Event())
            body = {"prompt": "the", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
            threads.append(threading.Thread(target=read_stream, args=(url, body, flags[-1], ends), daemon=True))
            threads[-1].start()
        assert flags[0].wait(30), "the first stream never started"
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        time.sleep(0.05)
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert httpx.get(url + "/health").status_code == 503
        rc = proc.wait(SHUTDOWN_S + 20)
        elapsed = time.monotonic() - t0
        for t in threads:
            t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(log)
    assert rc == 0, text
    assert elapsed < SHUTDOWN_S + 10, elapsed
    assert len(ends) == 3 and all(e.startswith(("finish:", "error:")) for e in ends), (ends, text)
    assert "KV" in text or "kv" in text.lower(), "the memory plan was not printed"
    assert "server stopped" in text
