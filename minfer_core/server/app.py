"""FastAPI routes of ``minfer serve``: OpenAI's completions, chat completions and models, plus
``/health`` and ``/metrics``.

The server serves one model and accepts any ``model`` name in a request (clients written for
OpenAI send their own); responses carry the served id, which ``/v1/models`` lists.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from functools import partial
from typing import AsyncIterator

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2.exceptions import TemplateError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..chat_template import render_chat
from ..sampling import file_defaults
from . import protocol as P
from .metrics import Metrics
from .runner import EngineRunner, Event, QueueFull, Request, Stream, UserError

log = logging.getLogger("minfer.serve")
DISCONNECT_POLL_S = 0.1  # how often a non-streaming request checks that its client is still there
#: The largest request body: BODY_BASE bytes plus BODY_PER_TOKEN a token of context (a prompt that
#: fills the context as text, JSON-escaped, or as token ids, stays well under it). Larger: a 413.
BODY_BASE, BODY_PER_TOKEN = 1 << 20, 256
#: Request bodies of up to INLINE_CHARS bytes are parsed on the event loop, and completion prompts of
#: up to INLINE_CHARS characters tokenized there (microseconds); larger ones in a worker thread, so
#: that they hold up no other request nor /health. Chats are rendered and tokenized in a worker
#: thread always: their cost grows with the number of messages as well as their text.
INLINE_CHARS = 1 << 14
DRAIN_BYTES = 64 << 20  # the most of a refused body read (and dropped) before the connection closes


def create_app(runner: EngineRunner, model_id: str, chat_template: str | None = None,
               sampling_defaults: dict | None = None) -> FastAPI:
    """The ASGI app. Starting it (lifespan) starts the engine thread; stopping it stops the thread
    and ends every open request with an error. ``sampling_defaults`` (SamplerConfig fields, from
    ``serve``'s flags) fill what a request leaves out, ahead of the model file's ``general.sampling.*``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runner.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            runner.stop()

    app = FastAPI(title="minfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runner, app.state.model_id = runner, model_id
    metrics = app.state.metrics = Metrics(runner)
    tok = runner.engine.tok
    from_file, refused = file_defaults(runner.engine.engine.gf.metadata)
    for line in refused:
        log.warning("minfer: %s", line)
    sampling_defaults = {**from_file, **(sampling_defaults or {})}  # the server's flags win over the file

    # -- errors --------------------------------------------------------------------------------
    def error_response(e: P.APIError) -> JSONResponse:
        metrics.rejected.labels(str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(P.APIError)
    async def _api_error(_, e: P.APIError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_, e: RequestValidationError):
        return error_response(validation_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(P.APIError(e.status_code, str(e.detail), kind, headers=e.headers))  # 405: Allow

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(http: HTTPRequest, _):
        log.debug("minfer: %s %s: the client left before its body was read", http.method, http.url.path)
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _server_error(_, e: Exception):
        # Starlette sends this reply, then re-raises e for uvicorn to log with its traceback
        return error_response(P.APIError(500, "the server failed on this request (see its log)", "server_error"))

    # -- endpoints -----------------------------------------------------------------------------
    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' probes
    async def health():
        stats = runner.engine.stats()
        status = "error" if not runner.alive else "draining" if runner.draining else "ok"
        body = {"status": status, "inflight": runner.inflight, **stats}
        if runner.failed:
            body["error"] = runner.failed
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    card = {"id": model_id, "object": "model", "created": 0, "owned_by": "minfer", "max_model_len": runner.engine.n_ctx}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_id:
            raise StarletteHTTPException(404, f"the model '{name}' does not exist: this server serves '{model_id}'")
        return card

    body_limit = BODY_BASE + BODY_PER_TOKEN * runner.engine.n_ctx

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        body = await parse_body(http, P.CompletionRequest, body_limit)
        prompt = body.prompt_value()
        if isinstance(prompt, str):
            ids = await off_loop(len(prompt), tok.encode, prompt, add_special=True, parse_special=True)
        else:
            bad = [i for i in prompt if not 0 <= i < tok.vocab_size]
            if bad:
                raise P.APIError(400, f"prompt: token id {bad[0]} is outside the vocabulary", param="prompt")
            ids = list(prompt)
        return await generate(http, body, ids, body.token_limit(16), chat=False)

    def chat_ids(body: P.ChatCompletionRequest) -> list[int]:
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        try:
            text = render_chat(chat_template, body.template_messages(), add_generation_prompt=True,
                               bos_token=bos, eos_token=eos)
        except TemplateError as e:
            raise P.APIError(400, f"messages: the chat template rejected them: {e}", param="messages") from None
        ids = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        return ids

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        body = await parse_body(http, P.ChatCompletionRequest, body_limit)
        if not chat_template:
            raise P.APIError(400, "the served model has no chat template (tokenizer.chat_template): "
                                  "use /v1/completions", param="messages")
        ids = await run_in_threadpool(chat_ids, body)
        return await generate(http, body, ids, body.token_limit(-1, "max_completion_tokens"), chat=True)

    # -- generation ----------------------------------------------------------------------------
    async def generate(http: HTTPRequest, body, ids: list[int], max_tokens: int, chat: bool):
        if runner.draining or not runner.alive:
            raise P.APIError(503, "the server is shutting down" if runner.draining else runner.failed or
                             "the engine is not running", "server_error", code="unavailable")
        if not ids:
            raise P.APIError(400, "the prompt is empty", param="prompt")
        n_ctx = runner.engine.n_ctx
        if len(ids) >= n_ctx:
            raise context_error(len(ids), n_ctx)
        req = Request(prompt_ids=ids, max_tokens=max_tokens, sampling=body.sampler(sampling_defaults),
                      stop=body.stop_list(), ignore_eos=body.ignore_eos)
        try:
            stream = runner.submit(req)
        except QueueFull:
            raise P.APIError(429, "the request queue is full: retry later", "rate_limit_error",
                             code="queue_full", headers={"Retry-After": "1"}) from None
        except UserError as e:
            raise P.APIError(400, str(e), param="prompt", code="context_length_exceeded") from None
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        metrics.requests.labels("chat" if chat else "completions", str(body.stream).lower()).inc()
        if body.stream:
            sse = stream_events(http, stream, rid, chat, body.include_usage())
            return StreamingResponse(sse, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        text, final = [], None
        async for ev in events(http, stream, poll_disconnect=True):
            text.append(ev.text)
            final = ev if ev.finished else None
        if final is None:  # the client went away
            return Response(status_code=499)
        if final.finish_reason not in P.FINISH:
            raise final_error(final)
        return P.completion(rid, model_id, "".join(text), P.FINISH[final.finish_reason], final.prompt_tokens,
                            final.completion_tokens, chat)

    async def stream_events(http, stream: Stream, rid: str, chat: bool, include_usage: bool) -> AsyncIterator[str]:
        chunk = partial(P.chunk, rid, model_id, chat, created=int(time.time()))  # one timestamp a stream
        if chat:
            yield sse(chunk(role=True))
        async for ev in events(http, stream):
            if not ev.finished:
                if ev.text:
                    yield sse(chunk(text=ev.text))
                continue
            if ev.finish_reason in P.FINISH:
                yield sse(chunk(text=ev.text, finish=P.FINISH[ev.finish_reason]))
                if include_usage:
                    yield sse(chunk(usage_=P.usage(ev.prompt_tokens, ev.completion_tokens)))
            else:
                yield sse(final_error(ev).body())
            yield "data: [DONE]\n\n"

    async def events(http: HTTPRequest, stream: Stream, poll_disconnect: bool = False) -> AsyncIterator[Event]:
        """A request's events up to and including the final one, timed into the metrics. If the
        consumer stops early (client gone, task cancelled) the request is cancelled in the engine."""
        finished = False
        last = None
        checked = time.perf_counter()
        try:
            while not finished:
                if poll_disconnect:
                    if time.perf_counter() - checked >= DISCONNECT_POLL_S:
                        if await http.is_disconnected():
                            return
                        checked = time.perf_counter()
                    try:
                        ev = await asyncio.wait_for(stream.queue.get(), DISCONNECT_POLL_S)
                    except asyncio.TimeoutError:
                        continue
                else:
                    ev = await stream.queue.get()
                now = time.perf_counter()
                n = len(ev.token_ids or ())
                if n:
                    if last is None:
                        metrics.ttft.observe(now - stream.submitted)
                    else:
                        for _ in range(n):
                            metrics.itl.observe((now - last) / n)
                    last = now
                finished = ev.finished
                if finished:
                    metrics.e2e.observe(now - stream.submitted)
                yield ev
        finally:
            if not finished:
                runner.cancel(stream.id)

    return app


# -- helpers -----------------------------------------------------------------------------------

#: Line breaks to str.splitlines (so to httpx's iter_lines) that json.dumps leaves raw in strings: escaped
SSE_ESCAPES = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(obj: dict) -> str:
    """One server-sent event of ``obj``: its JSON on one line, to any line splitter."""
    return f"data: {json.dumps(obj, ensure_ascii=False).translate(SSE_ESCAPES)}\n\n"


async def off_loop(size: int, fn, *args, **kw):
    """``fn(*args, **kw)`` for a text of ``size`` characters (or bytes): in a worker thread when it is long."""
    return fn(*args, **kw) if size <= INLINE_CHARS else await run_in_threadpool(fn, *args, **kw)


async def read_body(http: HTTPRequest, limit: int) -> bytes:
    """The request body, or a 413 once it is known to exceed ``limit`` bytes. The rest of such a
    body is read and dropped (up to DRAIN_BYTES), so that a client sending it whole before it reads
    the reply gets the 413 rather than a reset connection."""
    declared = http.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    if not (over and int(declared) > DRAIN_BYTES):
        async for chunk in http.stream():
            size += len(chunk)
            over = over or size > limit
            if over and size > DRAIN_BYTES:
                break
            if not over:
                chunks.append(chunk)
    if over:
        n = f"{int(declared):,}" if declared.isdigit() else f"over {limit:,}"
        raise P.APIError(413, f"the request body is {n} bytes; this server takes at most {limit:,}",
                         code="request_too_large")
    return b"".join(chunks)


async def parse_body(http: HTTPRequest, model: type[BaseModel], limit: int):
    """The request body as ``model``: parsed and validated in a worker thread when it is large."""
    raw = await read_body(http, limit)
    return await off_loop(len(raw), decode_body, raw, model)


def decode_body(raw: bytes, model: type[BaseModel]):
    """``raw`` as ``model``, or a 400 saying what is wrong with it."""
    try:
        obj = json.loads(raw, parse_constant=not_json_number)
        # JSON may escape half a UTF-16 pair (\ud800), which is no character to tokenize or echo
        json.dumps(obj, ensure_ascii=False).encode()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise P.APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise P.APIError(400, "the request body is not valid JSON: nested too deeply") from None
    except UnicodeEncodeError:
        raise P.APIError(400, "the request body is not valid JSON: a string holds a lone UTF-16 surrogate "
                              "(\\ud800-\\udfff)") from None
    except ValueError as e:  # NaN / Infinity, or an integer of more digits than int() takes (4300)
        raise P.APIError(400, f"the request body is not valid JSON: {str(e).split(';')[0]}") from None
    if not isinstance(obj, dict):
        raise P.APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise validation_error(e.errors()) from None


def not_json_number(name: str):
    """json.loads' parse_constant: NaN, Infinity and -Infinity are no JSON."""
    raise ValueError(f"{name} is not a JSON number")


def validation_error(errors) -> P.APIError:
    """pydantic's first error as a 400 naming the field; a field that fits none of its union's
    types (every error under it) is named itself, with what each type said."""
    errors = list(errors) or [{"loc": (), "msg": "invalid request"}]
    locs = [[str(x) for x in e.get("loc", ()) if x != "body"] for e in errors]
    loc = locs[0]
    for other in locs[1:]:
        n = next((i for i, (a, b) in enumerate(zip(loc, other)) if a != b), min(len(loc), len(other)))
        loc = loc[:n]
    if not loc:  # errors in unrelated fields: the first one
        loc = locs[0]
    msgs = [str(e.get("msg", "invalid request")).removeprefix("Value error, ") for e in errors]
    msg = msgs[0] if loc == locs[0] else "; ".join(dict.fromkeys(msgs))
    param = ".".join(loc) if loc else (msg.split(":", 1)[0] if ":" in msg and " " not in msg.split(":", 1)[0]
                                       else None)
    return P.APIError(400, f"{param}: {msg}" if loc else msg, param=param)


def context_error(n_prompt: int, n_ctx: int) -> P.APIError:
    return P.APIError(400, f"the prompt is {n_prompt} tokens; this server's context is {n_ctx} tokens",
                      param="prompt", code="context_length_exceeded")


def final_error(ev: Event) -> P.APIError:
    if ev.finish_reason == "cancelled":
        return P.APIError(503, ev.error or "the request was cancelled (server shutting down)", "server_error",
                          code="cancelled")
    return P.APIError(500, ev.error or "generation failed", "server_error", code="engine_error")
