"""``minfer serve``: an OpenAI-compatible HTTP server over the batched engine."""

from __future__ import annotations

import logging
import sys

from ..errors import UserError
from . import values
from .common import add_sampler_flags, check_ctx, given_sampling, log, requested_ctx

ENGINE_OPTIONS = True


def add_parser(sub):
    p = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server (completions, chat, streaming)",
        description="Serve one model over HTTP: POST /v1/completions, /v1/chat/completions; GET /v1/models[/ID], "
                    "/health, /metrics (Prometheus). Any 'model' name in a request is accepted. SIGTERM "
                    "drains: new requests get 503, running ones finish within --shutdown-timeout, then exit 0.")
    p.add_argument("-m", "--model", metavar="FILE", help="GGUF file or known model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("-c", "--ctx-size", type=values.ctx_size, default=None, metavar="N",
                   help="context size per sequence in tokens (default: 4096, or the model's if smaller; "
                        "0 = the model's; more than the model's is an error)")
    p.set_defaults(ctx_default=4096)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default: 8080; 0 = any free port)")
    p.add_argument("--parallel", "-np", type=int, default=8, metavar="N",
                   help="sequences decoded together (default: 8); up to 8 the batched step uses the plugins' "
                        "row-invariant kernels, other weights run over fixed row tiles (on a GPU 16 rows up to "
                        "16 sequences, 32 up to 32, 64 up to 64, 128 above); at 1 decode steps run the "
                        "single-stream decode kernels")
    p.add_argument("--max-queue", type=int, default=256, metavar="Q",
                   help="requests waiting beyond --parallel before new ones get 429 (default: 256)")
    p.add_argument("--gpu-memory", type=values.number(0, lo_open=True), default=None, metavar="FRACTION",
                   help="GPU memory for weights + KV pool: a fraction of the device (<= 1) or GiB (> 1) "
                        "(default: 0.9)")
    p.add_argument("--block-size", type=int, default=16, metavar="N", help="KV cache block size in tokens (default: 16)")
    p.add_argument("--served-model-name", metavar="NAME", help="id reported by /v1/models (default: the file's stem)")
    p.add_argument("--shutdown-timeout", type=values.number(0), default=30.0, metavar="S",
                   help="seconds running requests may take to finish after SIGTERM (default: 30)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logs and an access log")
    g = p.add_argument_group("request defaults", "Sampling for the fields a request leaves out: these flags, "
                             "then the model file's general.sampling.* values, then OpenAI's defaults "
                             "(temperature 1, top_p 1, top_k 0 = off, min_p 0, repeat_penalty 1, "
                             "repeat_last_n 64).")
    add_sampler_flags(g, shown_defaults=False)
    return p


def check_args(args) -> None:
    for flag, value, low in (("--parallel", args.parallel, 1), ("--max-queue", args.max_queue, 0),
                             ("--block-size", args.block_size, 1)):
        if value < low:
            raise UserError(f"{flag} must be >= {low}, got {value}")
    if args.gpu_memory is not None and args.gpu_memory <= 0:
        raise UserError(f"--gpu-memory must be > 0 (a fraction <= 1 or GiB > 1), got {args.gpu_memory}")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    if args.shutdown_timeout < 0:
        raise UserError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")


def run(args) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise UserError(f"minfer serve needs the serve extra ({e.name} is missing): pip install 'minfer[serve]'") from None
    from ..batch_engine import BatchEngine
    from ..cli import blocked_plugins
    from ..fetch import resolve_model
    from ..gguf_file import open_gguf
    from ..server.app import create_app
    from ..server.lifecycle import serve
    from ..server.runner import EngineRunner

    check_args(args)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(message)s")
    path = resolve_model(args.model)
    check_ctx(args, path)
    engine = BatchEngine.load(path, n_ctx=requested_ctx(args), parallel=args.parallel, max_queue=args.max_queue,
                              gpu_memory=args.gpu_memory, block_size=args.block_size,
                              backend=getattr(args, "backend", None), policy=getattr(args, "policy", None),
                              blocked=blocked_plugins(args), device=getattr(args, "device", None),
                              trace_plugins=getattr(args, "trace_plugins", False), progress=sys.stderr.isatty())
    template = open_gguf(path).metadata.get("tokenizer.chat_template")
    model_id = args.served_model_name or path.stem
    log(engine.memory_plan())
    if not template:
        log(f"minfer: {path.name} has no chat template: /v1/chat/completions will answer 400")
    runner = EngineRunner(engine)
    app = create_app(runner, model_id, template, given_sampling(args))
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    log(f"minfer: serving {model_id} at http://{host if ':' not in host else f'[{host}]'}:{port}/v1 "
        f"(parallel {args.parallel}, queue {args.max_queue}, context {engine.n_ctx})")
    serve(app, runner, args.host, port, args.shutdown_timeout, log_level="debug" if args.verbose else "warning",
          sockets=[sock])
    log("minfer: server stopped")
    return 0


def bind(host: str, port: int):
    """A listening socket, so that port 0 resolves to a real port before the URL is printed."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen: {e.strerror or e}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
