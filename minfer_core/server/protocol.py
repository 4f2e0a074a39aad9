"""OpenAI request bodies (pydantic) and the response / chunk JSON the server sends.

Fields OpenAI defines but minfer cannot honour are accepted only at their neutral value (``n=1``,
no logprobs, no penalties, no tools); anything else is a 400 naming the field. Extensions beyond
OpenAI's set, as in llama.cpp's server: ``top_k``, ``min_p``, ``repeat_penalty``, ``repeat_last_n``,
``ignore_eos``, ``n_predict`` (``max_tokens``' llama.cpp name, -1 for no limit).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from ..sampling import SamplerConfig


class APIError(Exception):
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _NullIsDefault(BaseModel):
    """A model whose optional fields take their default for an explicit null, as OpenAI's nullable
    fields do (the openai client sends null for a None argument)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data):
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}


class StreamOptions(_NullIsDefault):
    include_usage: StrictBool = False


class _Common(_NullIsDefault):
    """Fields shared by both endpoints."""

    # unknown fields are ignored, as OpenAI does; integers and booleans must be JSON's own (no
    # true for 1, no "3" for 3, no "yes" for true); numbers must be finite (1e999 parses to inf)
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str = ""
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    seed: Optional[StrictInt] = Field(None, ge=-1, lt=1 << 64)  # -1: a random seed
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None
    # extensions
    top_k: StrictInt = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    repeat_penalty: float = Field(1.0, gt=0.0)
    repeat_last_n: StrictInt = Field(64, ge=-1)  # the penalty's window: 0 = off, -1 = the whole context
    ignore_eos: StrictBool = False
    n_predict: Optional[StrictInt] = Field(None, ge=-1)

    @model_validator(mode="after")
    def _supported(self):
        if self.n_predict == 0:
            raise ValueError("n_predict: must be -1 (no limit) or at least 1")
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported (use repeat_penalty)")
        if self.logit_bias:
            raise ValueError("logit_bias: not supported")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 sequences")
        return self

    def token_limit(self, default: int, *fields: str) -> int:
        """The first of ``fields`` (then ``max_tokens``, then ``n_predict``) that the request set, else
        ``default``; -1 means no limit."""
        for name in (*fields, "max_tokens", "n_predict"):
            if getattr(self, name) is not None:
                return getattr(self, name)
        return default

    def stop_list(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def sampler(self, defaults: dict | None = None) -> SamplerConfig:
        """The request's sampling; a field it does not set (or sets to null) takes ``defaults`` (the
        server's: its flags, then the model file's ``general.sampling.*``, as SamplerConfig fields)
        where that has it."""
        d = defaults or {}

        def pick(name: str, field: str):
            return getattr(self, name) if name in self.model_fields_set or field not in d else d[field]

        top_p = pick("top_p", "top_p")
        temp = 0.0 if top_p == 0 else pick("temperature", "temp")  # top_p -> 0 keeps only the best token
        return SamplerConfig(temp=temp, top_k=pick("top_k", "top_k"), top_p=top_p or 1.0,
                             min_p=pick("min_p", "min_p"), repeat_penalty=pick("repeat_penalty", "repeat_penalty"),
                             repeat_last_n=pick("repeat_last_n", "repeat_last_n"), seed=self.seed)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]]
    echo: StrictBool = False
    logprobs: Optional[StrictInt] = None
    best_of: Optional[StrictInt] = None
    suffix: Optional[str] = None

    @model_validator(mode="after")
    def _one_prompt(self):
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ValueError("prompt: only one prompt per request is supported")
        for name in ("echo", "logprobs", "suffix"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of: only 1 is supported")
        return self

    def prompt_value(self) -> str | list[int]:
        """The single prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            return p[0]
        return p


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    logprobs: Optional[StrictBool] = None
    tools: Optional[list[Any]] = None
    response_format: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _chat_supported(self):
        if self.logprobs:
            raise ValueError("logprobs: not supported")
        if self.tools:
            raise ValueError("tools: not supported")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise ValueError("response_format: only type 'text' is supported")
        return self

    def template_messages(self) -> list[dict]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


# -- responses ---------------------------------------------------------------------------------

FINISH = {"stop": "stop", "eog": "stop", "length": "length", "context": "length"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, text: str, finish: str, prompt_tokens: int, completion_tokens: int,
               chat: bool) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def chunk(rid: str, model: str, chat: bool, text: str | None = None, finish: str | None = None,
          role: bool = False, usage_: dict | None = None, created: int | None = None) -> dict:
    """One streamed chunk: a text delta, a final one with ``finish``, or (``usage_``) the usage
    chunk with no choices. Every chunk of a stream has the same ``created`` (default: now)."""
    out = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
           "created": int(time.time()) if created is None else created, "model": model}
    if usage_ is not None:
        out["choices"], out["usage"] = [], usage_
        return out
    if chat:
        delta: dict = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        out["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        out["choices"] = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    return out
