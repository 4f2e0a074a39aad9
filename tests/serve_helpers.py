"""Shared by the test_serve_* files: a tiny synthesized model with a chat template, and a live
``minfer serve`` app running under uvicorn in a thread on a free loopback port."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from gguf import GGMLQuantizationType as QT

from minfer_core.chat_template import CHATML_TEMPLATE
from minfer_core.synth import synthesize, tiny_layout, write_layout


def tiny_model(dir: Path, template: str | None = CHATML_TEMPLATE, n_ctx: int = 512) -> Path:
    md, ts = tiny_layout("qwen2", QT.Q8_0)
    md["qwen2.context_length"] = n_ctx
    if template:
        md["tokenizer.chat_template"] = template
    layout, out = dir / "serve.layout.gguf", dir / "serve.gguf"
    write_layout(layout, md, ts)
    synthesize(layout, out, progress=False)
    return out


def load_engine(path: Path, n_ctx: int = 256, parallel: int = 4, max_queue: int = 16):
    from minfer_core.batch_engine import BatchEngine
    return BatchEngine.load(path, n_ctx=n_ctx, parallel=parallel, max_queue=max_queue, device="cpu",
                            backend="reference", progress=False)


@contextmanager
def live_server(engine, template: str | None = CHATML_TEMPLATE, model_id: str = "tiny", sampling_defaults=None):
    """Yield ``(base_url, app)`` of a running server; stop it (bounded) on exit."""
    import uvicorn

    from minfer_core.commands.serve import bind
    from minfer_core.server.app import create_app
    from minfer_core.server.lifecycle import uvicorn_config
    from minfer_core.server.runner import EngineRunner

    runner = EngineRunner(engine)
    app = create_app(runner, model_id, template, sampling_defaults)
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    t_end = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < t_end, "server did not start"
        time.sleep(0.02)
    try:
        yield base, app
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "server did not stop"


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post_raw(url: str, data: bytes, timeout: float = 30) -> tuple[int, dict]:
    """POST ``data`` as a JSON body as it is (malformed, oversized); the status and the JSON reply."""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus text format."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)
