"""The GGUF file's own tokenizer, behaving like llama.cpp's (``llama-vocab.cpp``).

Byte-level BPE (``tokenizer.ggml.model == "gpt2"``) built from ``tokenizer.ggml.tokens`` /
``merges`` / ``token_type``. Encoding is three steps, as in llama.cpp:

1. special tokens are cut out of the text, longest token text first (control and unknown
   tokens only when ``parse_special``; user-defined tokens always);
2. every remaining piece goes through the pre-tokenizer regexes that ``tokenizer.ggml.pre`` names,
   then the GPT-2 byte-to-unicode map, then BPE merges (HF ``tokenizers`` does steps 2-3);
3. BOS/EOS are added when ``add_special`` and the file (or llama.cpp's default) asks for them.

Decoding maps each token back to bytes (control tokens to their text when ``special``).
"""

from __future__ import annotations

import codecs
import logging
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, pre_tokenizers

from .vocab_meta import read_vocab, shown

log = logging.getLogger(__name__)

# token_type values (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# -- pre-tokenizers ------------------------------------------------------------------------------
# Split regexes, applied one after the other (each splits the pieces of the previous one).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "llama3": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+",),
    "qwen2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+",),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
}


@dataclass(frozen=True)
class _Pre:
    regexes: str  # key of _REGEXES
    clean_spaces: bool = True  # decode drops the space before , . ! ? and some contractions
    ignore_merges: bool = False  # a pre-token that is itself in the vocabulary is one token
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_LLAMA3 = _Pre("llama3", ignore_merges=True, add_bos=True)
_QWEN2 = _Pre("qwen2", clean_spaces=False)
_GPT2_PRE = _Pre("gpt2")
_STARCODER = _Pre("starcoder")
# tokenizer.ggml.pre -> behaviour (the subset of llama.cpp's table that minfer supports)
PRE_TOKENIZERS: dict[str, _Pre] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    _LLAMA3),
    "dbrx": _Pre("llama3"), "smaug-bpe": _Pre("llama3"),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), _QWEN2),
    "stablelm2": _Pre("qwen2"), "qwen35": _Pre("qwen35", clean_spaces=False),
    **dict.fromkeys(("starcoder", "refact", "codeshell", "exaone"), _STARCODER),
    **dict.fromkeys(("smollm", "command-r"), _Pre("starcoder", clean_spaces=False)),
    **dict.fromkeys(("gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "mpt", "olmo", "jais", "exaone4"), _GPT2_PRE),
    "default": _Pre("default"),
}

# llama.cpp finds these roles by token text when the file gives no id; the token found is forced
# to control type, and the fim pad/repo/separator ones end generation.
_ROLE_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
            "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Every token with one of these texts ends generation (and is forced to control type).
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
))
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined


def special_tokens(meta: Mapping[str, Any], tokens: Sequence[str],
                   types: list[int]) -> tuple[int | None, int | None, set[int]]:
    """llama.cpp's special-token set-up: returns ``(bos, eos, eog_ids)`` and updates ``types`` in
    place (tokens found by text become control, a few become user-defined or normal)."""
    n = len(tokens)
    text_to_id = {t: i for i, t in enumerate(tokens)}
    bos = _opt_id(meta, "bos", n, 11)  # llama.cpp's gpt2 defaults: BOS = EOS = 11 unless named
    eos = _opt_id(meta, "eos", n, 11)
    role: dict[str, int | None] = {}
    for key, texts in _ROLE_TEXTS.items():
        legacy = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}.get(key)
        role[key] = _opt_id(meta, key, n)
        if role[key] is None and legacy:
            role[key] = _opt_id(meta, legacy, n)
        if role[key] is None:  # llama.cpp takes the first match in hash order; we take the lowest id
            found = sorted(i for t in texts if (i := text_to_id.get(t)) is not None)
            if found:
                role[key] = found[0]
                if types[found[0]] != CONTROL:
                    types[found[0]] = CONTROL
    eog = {i for k in ("fim_pad", "fim_rep", "fim_sep") if (i := role[k]) is not None}
    for t in _EOG_TEXTS:
        if (i := text_to_id.get(t)) is not None:
            eog.add(i)
            if types[i] != CONTROL:
                types[i] = CONTROL
    for t in _ALWAYS_RENDERED:
        if (i := text_to_id.get(t)) is not None:
            types[i] = USER_DEFINED
    eog.update(i for i in (eos, role["eot"], role["eom"]) if i is not None)
    eog_texts = {tokens[i] for i in eog}
    end = text_to_id.get("<|end|>")
    if end in eog and ({"<|return|>", "<|call|>"} <= eog_texts or {"<|calls|>", "<|flush|>"} <= eog_texts):
        eog.discard(end)  # harmony / solar-open: <|end|> closes a message, not the generation
        types[end] = USER_DEFINED
    s_end = text_to_id.get("</s>")
    if s_end in eog and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.discard(s_end)  # gemma4 / plamo: </s> is an ordinary token
        types[s_end] = NORMAL
    return bos, eos, eog


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def _opt_id(meta: Mapping[str, Any], key: str, n_vocab: int, default: int | None = None) -> int | None:
    v = meta.get(f"tokenizer.ggml.{key}_token_id")
    if v is None or not 0 <= int(v) < n_vocab:
        return default if default is not None and default < n_vocab else None
    return int(v)


class Tokenizer:
    """Encode/decode with a GGUF vocabulary. Build it with :meth:`from_metadata`."""

    def __init__(self, tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], pre: str | None,
                 bos_id: int | None, eos_id: int | None, add_bos: bool | None = None, add_eos: bool = False,
                 eog_ids: frozenset[int] = frozenset()):
        if pre is None or pre == "":
            log.warning("tokenizer.ggml.pre is missing: using llama.cpp's 'default' pre-tokenizer "
                        "(generation quality may be degraded; re-convert the model)")
            pre = "default"
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); "
                             f"minfer knows: {', '.join(sorted(PRE_TOKENIZERS))}")
        self.pre, self._pre = pre, PRE_TOKENIZERS[pre]
        self._tokens = list(tokens)
        self._types = list(types) if types else [NORMAL] * len(self._tokens)
        self.vocab_size = len(self._tokens)
        self.bos_id, self.eos_id = bos_id, eos_id
        self.add_bos = self._pre.add_bos if add_bos is None else bool(add_bos)
        self.add_eos = bool(add_eos)
        self.eog_ids = frozenset(eog_ids)
        special = [i for i, t in enumerate(self._types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        special.sort(key=lambda i: -len(self._tokens[i].encode()))
        self._special = [(self._tokens[i], i, self._types[i] == USER_DEFINED) for i in special]
        self._merges: Sequence[str] | None = merges
        self._hf_tok: _HFTokenizer | None = None  # built on first encode (~1 s for 150k tokens)
        self._hf_lock = threading.Lock()  # the server encodes in worker threads
        self._pieces: dict[int, bytes] = {}

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata (``tokenizer.ggml.*`` keys, arrays as sequences); a missing,
        mistyped or inconsistent key is a ``ValueError`` naming it."""
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise NotImplementedError(f"tokenizer.ggml.model {shown(model)} is not supported "
                                      f"(only 'gpt2' byte-level BPE)")
        v = read_vocab(meta)  # checked arrays and flags (ValueError names the key)
        bos, eos, eog = special_tokens(meta, v.tokens, v.types)
        return cls(v.tokens, v.types, v.merges, v.pre, bos, eos, add_bos=v.add_bos, add_eos=v.add_eos,
                   eog_ids=frozenset(eog))

    @property
    def _hf(self) -> _HFTokenizer:
        with self._hf_lock:
            if self._hf_tok is None:
                self._hf_tok, self._merges = self._build_hf(self._merges or ()), None
            return self._hf_tok

    def _build_hf(self, merges: Sequence[str]) -> _HFTokenizer:
        vocab = {t: i for i, t in enumerate(self._tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        try:
            bpe = models.BPE(vocab, pairs, byte_fallback=False, ignore_merges=self._pre.ignore_merges)
        except Exception:  # HF refuses merges whose parts are not in the vocabulary: drop those
            pairs = [p for p in pairs if len(p) == 2 and p[0] in vocab and p[1] in vocab and p[0] + p[1] in vocab]
            bpe = models.BPE(vocab, pairs, byte_fallback=False, ignore_merges=self._pre.ignore_merges)
        hf = _HFTokenizer(bpe)
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _REGEXES[self._pre.regexes]]
        hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                      use_regex=False)])
        return hf

    # -- encode ----------------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of ``text``, longest first, like llama.cpp's st_partition."""
        parts: list[str | int] = [text] if text else []
        for tok_text, tid, user_defined in self._special:
            if not (parse_special or user_defined) or tok_text not in text:
                continue
            out: list[str | int] = []
            for p in parts:
                if isinstance(p, int) or tok_text not in p:
                    out.append(p)
                    continue
                pieces = p.split(tok_text)
                for k, piece in enumerate(pieces):
                    if k:
                        out.append(tid)
                    if piece:
                        out.append(piece)
            parts = out
        return parts

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text -> ids. ``add_special``: add BOS/EOS where the model wants them; ``parse_special``:
        control tokens written in the text (``<|im_start|>``) become their ids."""
        parts = self._partition(text, parse_special)
        ids: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise ValueError("the model wants a BOS token but has none")
            ids.append(self.bos_id)
        hf = self._hf
        for p in parts:  # one encode per piece: encode_batch would start HF's thread pool
            if isinstance(p, int):
                ids.append(p)
            else:
                ids.extend(hf.encode(p, add_special_tokens=False).ids)
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    # -- decode ----------------------------------------------------------------------------------
    def token_text(self, id: int) -> str:
        """The raw vocabulary entry (byte-level characters, e.g. ``Ġworld``)."""
        return self._tokens[id]

    def token_bytes(self, id: int, special: bool = True) -> bytes:
        """The bytes a token stands for; control/unknown tokens give their text only if ``special``."""
        t = self._types[id]
        if t in (CONTROL, UNKNOWN):
            return self._tokens[id].encode() if special else b""
        piece = self._pieces.get(id)
        if piece is None:
            text = self._tokens[id]
            if t == USER_DEFINED:
                piece = text.encode()
            elif t == NORMAL:
                piece = b"".join(bytes((_UNICODE_TO_BYTE[c],)) if c in _UNICODE_TO_BYTE else c.encode() for c in text)
            elif t == BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                piece = bytes((int(text[3:5], 16),))
            else:  # unused / undefined tokens render as nothing
                piece = b""
            self._pieces[id] = piece
        return piece

    def decode(self, ids: Sequence[int], special: bool = True) -> str:
        """Ids -> text (invalid UTF-8 becomes U+FFFD). ``special=False`` drops control tokens.
        Pre-tokenizers with ``clean_spaces`` (llama3, gpt2, default) tidy spaces as llama.cpp does."""
        data = b"".join(self.token_bytes(i, special) for i in ids)
        if self._pre.clean_spaces:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")


def _clean_spaces(s: bytes) -> bytes:
    """llama.cpp's detokenizer clean-up, three in-place passes over the bytes: drop the space in
    ' ?' ' !' ' .' ' ,'; turn " ' " into "'"; drop the space before 's 'm 're 've."""
    t = bytearray(s)
    n = len(t)
    total = 1 if n else 0  # pass 1
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    n, total, i = total, 1 if total else 0, 1  # pass 2
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    n, total = total, 1 if total else 0  # pass 3
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < n and bytes(t[i + 1:i + 3]) in (b"re", b"ve")):
                total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


class StreamDecoder:
    """Incremental detokenizer: :meth:`push` returns only complete UTF-8 text, holding back a
    character whose bytes are split over tokens; :meth:`flush` returns what is left.
    Control tokens are hidden unless ``special`` (like llama-cli's generated text)."""

    def __init__(self, tok: Tokenizer, special: bool = False):
        self.tok, self.special = tok, special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        return self._dec.decode(self.tok.token_bytes(id, self.special))

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
