"""Checked reads of the ``tokenizer.ggml.*`` metadata a GGUF vocabulary is built from.

The file is not trusted: arrays must hold the element type they should, per-token arrays must be
as long as the vocabulary, ids must be integers. Problems raise ``ValueError`` naming the key
(the engine reports it as a :class:`~minfer_core.gguf_file.ModelFileError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

NORMAL, BYTE = 1, 6  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL / _BYTE
_BYTE_SHAPE = re.compile(r"<0x..>", re.S)  # what the decoder treats as a byte token
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def shown(v: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters (messages stay one short line)."""
    r = repr(v)
    return r if len(r) <= limit else r[:limit - 3] + "..."


@dataclass
class VocabMeta:
    tokens: list[str]  # empty entries already named [EMPTY_i], as llama.cpp does
    types: list[int]
    merges: list[str]
    pre: str | None
    add_bos: bool | None  # None: the pre-tokenizer's default
    add_eos: bool


def read_vocab(meta: Mapping[str, Any]) -> VocabMeta:
    """The vocabulary arrays and flags of a gpt2 (byte-level BPE) tokenizer, checked."""
    tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(_strings(meta, "tokenizer.ggml.tokens"))]
    if not tokens:
        raise ValueError("tokenizer.ggml.tokens is empty")
    if "tokenizer.ggml.merges" not in meta:
        raise ValueError("tokenizer.ggml.merges is missing: a gpt2 tokenizer needs its BPE merges")
    merges = _strings(meta, "tokenizer.ggml.merges")
    types = _ints(meta, "tokenizer.ggml.token_type", len(tokens))
    for i, t in enumerate(types):  # a byte token the decoder would fail to parse
        if t == BYTE and _BYTE_SHAPE.fullmatch(tokens[i]) and not _BYTE_TOKEN.fullmatch(tokens[i]):
            raise ValueError(f"tokenizer.ggml.tokens[{i}] is {shown(tokens[i])}, not a byte token <0xHH>, "
                             f"but its token_type is BYTE")
    for key in [k for k in meta if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")]:
        if isinstance(meta[key], bool) or not isinstance(meta[key], int):
            raise ValueError(f"{key} is {shown(meta[key])}, not a token id")
    flags = {}
    for name in ("add_bos", "add_eos"):
        v = meta.get(f"tokenizer.ggml.{name}_token")
        if v is not None and not isinstance(v, (bool, int)):
            raise ValueError(f"tokenizer.ggml.{name}_token is {shown(v)}, not true or false")
        flags[name] = None if v is None else bool(v)
    pre = meta.get("tokenizer.ggml.pre")
    if pre is not None and not isinstance(pre, str):
        raise ValueError(f"tokenizer.ggml.pre is {shown(pre)}, not a pre-tokenizer name")
    return VocabMeta(tokens, types, merges, pre, flags["add_bos"], bool(flags["add_eos"]))


def _strings(meta: Mapping[str, Any], key: str) -> list[str]:
    if key not in meta:
        raise ValueError(f"{key} is missing: a gpt2 tokenizer needs it")
    v = meta[key]
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{key} must be an array of strings (got {shown(v)})")
    return list(v)


def _ints(meta: Mapping[str, Any], key: str, n: int) -> list[int]:
    v = meta.get(key)
    if v is None:
        return [NORMAL] * n
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ValueError(f"{key} must be an array of integers (got {shown(v)})")
    if len(v) != n:
        raise ValueError(f"{key} has {len(v)} entries for {n} tokens (they must match)")
    return list(v)
