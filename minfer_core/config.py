"""The model hyper-parameters, read from GGUF metadata and checked against the tensor table."""

from __future__ import annotations

from dataclasses import dataclass

from minfer_core.gguf_file import GGUFFile, ModelFileError

#: Supported architectures -> RoPE style. llama.cpp's converter permutes llama Q/K rows so
#: that GGUF "llama" rotates interleaved pairs ("normal"); qwen2 rotates halves ("neox").
ARCHITECTURES = {"llama": "normal", "qwen2": "neox"}


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


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    """Build the config; ``ModelFileError`` for an unsupported architecture, a missing or
    inconsistent key, or a tensor whose shape disagrees with the config."""
    arch = f.arch
    if arch not in ARCHITECTURES:
        raise ModelFileError(f.path, f"unsupported architecture {arch!r} "
                                     f"(supported: {', '.join(sorted(ARCHITECTURES))})")

    def num(key: str, kind=int, default=None):
        full = f"{arch}.{key}"
        v = f.get(full) if default is None else f.get(full, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
            raise ModelFileError(f.path, f"metadata key {full!r} has bad value {v!r}")
        return kind(v)

    n_embd = num("embedding_length")
    n_heads = num("attention.head_count")
    n_kv = num("attention.head_count_kv", default=n_heads)
    if n_heads <= 0 or n_kv <= 0 or n_heads % n_kv:
        raise ModelFileError(f.path, f"{n_heads} attention heads cannot share {n_kv} KV heads")
    if n_embd % n_heads and f"{arch}.attention.key_length" not in f.metadata:
        raise ModelFileError(f.path, f"embedding length {n_embd} is not divisible by {n_heads} heads")
    head_dim = num("attention.key_length", default=n_embd // n_heads)
    if num("attention.value_length", default=head_dim) != head_dim:
        raise ModelFileError(f.path, "key and value head sizes differ (not supported)")
    rope_dim = num("rope.dimension_count", default=head_dim)
    if rope_dim != head_dim:
        raise ModelFileError(f.path, f"partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
    if f.get(f"{arch}.rope.scaling.type", "none") not in ("none", ""):
        raise ModelFileError(f.path, f"RoPE scaling {f.get(f'{arch}.rope.scaling.type')!r} is not supported")

    if "rope_freqs.weight" in f.tensors:
        raise ModelFileError(f.path, "RoPE frequency factors (rope_freqs.weight) are not supported")
    embd = f.tensors.get("token_embd.weight")
    if embd is None:
        raise ModelFileError(f.path, "missing tensor 'token_embd.weight'")
    vocab = embd.shape[0] if len(embd.shape) == 2 else -1
    cfg = ModelConfig(
        arch=arch,
        n_layers=num("block_count"),
        n_embd=n_embd,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        n_ff=num("feed_forward_length"),
        vocab_size=vocab,
        ctx_len=num("context_length"),
        rope_base=num("rope.freq_base", float, default=10000.0),
        rope_style=ARCHITECTURES[arch],
        rms_eps=num("attention.layer_norm_rms_epsilon", float),
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        tied_output="output.weight" not in f.tensors,
        name=str(f.get("general.name", f.path.stem)),
    )
    n_tokens = len(f.get("tokenizer.ggml.tokens", []))
    if n_tokens > cfg.vocab_size:
        raise ModelFileError(f.path, f"tokenizer has {n_tokens} tokens but token_embd.weight only {vocab} rows")
    _check_tensors(f, cfg)
    return cfg


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


def _check_tensors(f: GGUFFile, cfg: ModelConfig) -> None:
    for name, shape in expected_shapes(cfg).items():
        t = f.tensors.get(name)
        if t is None:
            raise ModelFileError(f.path, f"missing tensor {name!r}")
        if tuple(t.shape) != shape:
            raise ModelFileError(f.path, f"tensor {name!r} has shape {list(t.shape)}, "
                                         f"expected {list(shape)} from the metadata")
