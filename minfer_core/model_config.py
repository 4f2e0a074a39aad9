"""The model hyper-parameters, read from GGUF metadata and checked against the tensor table.

Nothing here allocates by what the file says: every number is range-checked, the layer count must
match the blocks of the tensor table, and every tensor the model reads must be present with the
expected shape and type (and no other tensor may be) before the loader moves a byte.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType as QT

from minfer_core.gguf_file import GGUFFile, ModelFileError, shown

#: Supported architectures -> RoPE style. llama.cpp's converter permutes llama Q/K rows so
#: that GGUF "llama" rotates interleaved pairs ("normal"); qwen2 rotates halves ("neox").
ARCHITECTURES = {"llama": "normal", "qwen2": "neox"}
MAX_INT = 2**31 - 1  # llama.cpp keeps hyper-parameters in int32 / uint32
_BLOCK = re.compile(r"blk\.(\d{1,9})\.")  # longer numbers are not blocks (and int() of them is slow)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ff: int
    vocab_size: int
    ctx_len: int
    rope_base: float
    rope_style: str  # "neox" | "normal"
    rms_eps: float
    qkv_bias: bool
    tied_output: bool  # no output.weight: the output head reuses token_embd
    name: str

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


class _Keys:
    """Typed, range-checked reads of ``{arch}.*`` metadata keys."""

    def __init__(self, f: GGUFFile, arch: str):
        self.f, self.arch = f, arch

    def bad(self, key: str, problem: str) -> ModelFileError:
        return ModelFileError(self.f.path, f"metadata key {f'{self.arch}.{key}'!r} {problem}")

    def int(self, key: str, default: int | None = None, lo: int = 1, hi: int = MAX_INT) -> int:
        full = f"{self.arch}.{key}"
        v = self.f.get(full) if default is None else self.f.get(full, default)
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.bad(key, f"has bad value {shown(v)} (need a whole number)")
        if not lo <= v <= hi:
            raise self.bad(key, f"is {v}, out of range ({lo} to {hi})")
        return v

    def float(self, key: str, default: float | None, above: float, below: float = math.inf) -> float:
        full = f"{self.arch}.{key}"
        v = self.f.get(full) if default is None else self.f.get(full, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(key, f"has bad value {shown(v)} (need a number)")
        if not (math.isfinite(v) and above < v < below):
            limit = f"above {above:g}" + ("" if below == math.inf else f" and below {below:g}")
            raise self.bad(key, f"is {v:g}; it must be a finite number {limit}")
        return float(v)


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """Build the config; ``ModelFileError`` for an unsupported architecture, a missing, mistyped,
    out-of-range or inconsistent key, or a tensor table that disagrees with the config."""
    arch = f.arch
    if arch not in ARCHITECTURES:
        raise ModelFileError(f.path, f"unsupported architecture {shown(arch)} "
                                     f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    k = _Keys(f, arch)
    n_embd = k.int("embedding_length")
    n_heads = k.int("attention.head_count")
    n_kv = k.int("attention.head_count_kv", default=n_heads)
    if n_heads % n_kv:
        raise ModelFileError(f.path, f"{n_heads} attention heads cannot share {n_kv} KV heads "
                                     f"(head_count must be a multiple of head_count_kv)")
    if n_embd % n_heads and f"{arch}.attention.key_length" not in f.metadata:
        raise ModelFileError(f.path, f"embedding length {n_embd} is not divisible by {n_heads} heads")
    head_dim = k.int("attention.key_length", default=max(n_embd // n_heads, 1))
    if k.int("attention.value_length", default=head_dim) != head_dim:
        raise ModelFileError(f.path, "key and value head sizes differ (not supported)")
    if head_dim % 2:
        raise ModelFileError(f.path, f"head size {head_dim} is odd: RoPE rotates pairs of values")
    rope_dim = k.int("rope.dimension_count", default=head_dim)
    if rope_dim != head_dim:
        raise ModelFileError(f.path, f"partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
    scaling = f.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise ModelFileError(f.path, f"RoPE scaling {shown(scaling)} is not supported")
    n_layers = k.int("block_count")
    _check_blocks(f, arch, n_layers)

    if "rope_freqs.weight" in f.tensors:
        raise ModelFileError(f.path, "RoPE frequency factors (rope_freqs.weight) are not supported")
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f.path, "missing tensor 'token_embd.weight'")
    if len(embd.shape) != 2:
        raise ModelFileError(f.path, f"tensor 'token_embd.weight' has shape {list(embd.shape)}, expected 2 dimensions")
    vocab = embd.shape[0]
    cfg = ModelConfig(
        arch=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        n_ff=k.int("feed_forward_length"),
        vocab_size=vocab,
        ctx_len=k.int("context_length"),
        rope_base=k.float("rope.freq_base", 10000.0, above=1.0),
        rope_style=ARCHITECTURES[arch],
        rms_eps=k.float("attention.layer_norm_rms_epsilon", None, above=0.0, below=1.0),
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        tied_output="output.weight" not in f.tensors,
        name=str(f.get("general.name", f.path.stem)),
    )
    _check_vocab(f, k, vocab)
    _check_tensors(f, cfg)
    return cfg


def _check_blocks(f: GGUFFile, arch: str, n_layers: int) -> None:
    """block_count must name exactly the blocks ``blk.0`` .. ``blk.{n-1}`` of the tensor table
    (checked before anything is built per layer, so an absurd count costs nothing)."""
    present = {int(m.group(1)) for name in f.tensors if (m := _BLOCK.match(name))}
    top = max(present, default=-1)
    if len(present) == top + 1 == n_layers:  # distinct indices 0..top, as many as the layers
        return
    held = ("no blocks" if not present else f"blocks 0..{top}" if len(present) == top + 1 else
            f"{len(present)} blocks numbered {min(present)} to {top} with gaps")
    raise ModelFileError(f.path, f"metadata key '{arch}.block_count' is {n_layers} but the tensor table "
                                 f"holds {held}: the file is inconsistent")


def _check_vocab(f: GGUFFile, k: _Keys, vocab: int) -> None:
    """The tokenizer must have exactly one token per embedding row (else sampling can pick an id
    the tokenizer cannot print, or the prompt an id the embedding does not have)."""
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != vocab:
        raise ModelFileError(f.path, f"tokenizer has {len(tokens)} tokens but token_embd.weight has {vocab} rows "
                                     f"(they must match: the file is inconsistent)")
    if f"{k.arch}.vocab_size" in f.metadata and k.int("vocab_size") != vocab:
        raise k.bad("vocab_size", f"is {f.metadata[f'{k.arch}.vocab_size']} but token_embd.weight has {vocab} rows")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, with its torch-order shape (rows, cols)."""
    e, q, kv, ff = cfg.n_embd, cfg.q_dim, cfg.kv_dim, cfg.n_ff
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, e), "output_norm.weight": (e,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (cfg.vocab_size, e)
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_norm.weight": (e,), p + "ffn_norm.weight": (e,),
            p + "attn_q.weight": (q, e), p + "attn_k.weight": (kv, e), p + "attn_v.weight": (kv, e),
            p + "attn_output.weight": (e, q),
            p + "ffn_gate.weight": (ff, e), p + "ffn_up.weight": (ff, e), p + "ffn_down.weight": (e, ff),
        })
        if cfg.qkv_bias:
            shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
    return shapes


def optional_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors the loader reads when present (an attention output bias)."""
    return {f"blk.{i}.attn_output.bias": (cfg.n_embd,) for i in range(cfg.n_layers)}


def _check_tensors(f: GGUFFile, cfg: ModelConfig) -> None:
    expected, optional = expected_shapes(cfg), optional_shapes(cfg)
    for name, shape in expected.items():
        if name not in f.tensors:
            raise ModelFileError(f.path, f"missing tensor {name!r}")
    for name, t in f.tensors.items():
        shape = expected.get(name) or optional.get(name)
        if shape is None:
            raise ModelFileError(f.path, f"unexpected tensor {shown(name)}: a {cfg.n_layers}-block {cfg.arch} "
                                         f"model has no such tensor (wrong architecture?)")
        if tuple(t.shape) != shape:
            raise ModelFileError(f.path, f"tensor {name!r} has shape {list(t.shape)}, "
                                         f"expected {list(shape)} from the metadata")
        if len(shape) == 1 and t.qtype != QT.F32:  # norms and biases are read as f32
            raise ModelFileError(f.path, f"tensor {name!r} has type {t.qtype.name}, expected F32")
