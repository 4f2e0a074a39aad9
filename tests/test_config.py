"""ModelConfig from GGUF metadata: the real models against their published configs, and errors."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

from minfer_core.model_config import config_from_gguf, expected_shapes
from minfer_core.gguf_file import ModelFileError, open_gguf
from minfer_core.synth import synthesize, tiny_layout, write_layout


def test_qwen_config(qwen_path):
    # Qwen2.5-Coder-0.5B-Instruct config.json: 24 layers, hidden 896, 14 heads / 2 KV heads,
    # intermediate 4864, vocab 151936, rope_theta 1e6, rms_norm_eps 1e-6, q/k/v biases.
    c = config_from_gguf(open_gguf(qwen_path))
    assert (c.arch, c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff) == \
        ("qwen2", 24, 896, 14, 2, 64, 4864)
    assert (c.vocab_size, c.ctx_len, c.rope_base, c.rope_style) == (151936, 32768, 1e6, "neox")
    assert c.rms_eps == pytest.approx(1e-6) and c.qkv_bias and not c.tied_output
    assert (c.q_dim, c.kv_dim) == (896, 128)


def test_smollm_config(smollm_path):
    # SmolLM2-135M-Instruct config.json: 30 layers, hidden 576, 9 heads / 3 KV heads,
    # intermediate 1536, vocab 49152, rope_theta 1e5, rms_norm_eps 1e-5, tied embeddings.
    c = config_from_gguf(open_gguf(smollm_path))
    assert (c.arch, c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff) == \
        ("llama", 30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.ctx_len, c.rope_base, c.rope_style) == (49152, 8192, 1e5, "normal")
    assert c.rms_eps == pytest.approx(1e-5) and not c.qkv_bias and c.tied_output


def build(tmp_path, arch="qwen2", edit=None, name="m"):
    """A tiny synthesized model; ``edit(metadata, tensors)`` may break it first."""
    md, ts = tiny_layout(arch, QT.Q8_0)
    if edit:
        edit(md, ts)
    layout, out = tmp_path / f"{name}.layout.gguf", tmp_path / f"{name}.gguf"
    write_layout(layout, md, ts)
    synthesize(layout, out, progress=False)
    return out


def config_error(path) -> str:
    with pytest.raises(ModelFileError) as ei:
        config_from_gguf(open_gguf(path))
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    return msg


@pytest.mark.parametrize("arch,style,bias", [("qwen2", "neox", True), ("llama", "normal", False)])
def test_tiny_models(tmp_path, arch, style, bias):
    f = open_gguf(build(tmp_path, arch))
    c = config_from_gguf(f)
    assert (c.arch, c.rope_style, c.qkv_bias, c.tied_output) == (arch, style, bias, False)
    assert (c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff, c.vocab_size) == \
        (2, 256, 4, 2, 64, 512, 260)
    assert set(expected_shapes(c)) == set(f.tensors)


def test_defaults(tmp_path):
    def edit(md, ts):
        del md["qwen2.attention.head_count_kv"], md["qwen2.rope.freq_base"]
        for i, (n, q, shape) in enumerate(ts):  # K/V now as wide as Q
            if n.startswith("blk.") and n.split(".")[2] in ("attn_k", "attn_v"):
                ts[i] = (n, q, (256,) + shape[1:])
    c = config_from_gguf(open_gguf(build(tmp_path, edit=edit)))
    assert (c.n_kv_heads, c.rope_base) == (4, 10000.0)


def test_tied_output(tmp_path):
    c = config_from_gguf(open_gguf(build(tmp_path, edit=lambda md, ts: ts.pop())))
    assert c.tied_output


def test_unsupported_architecture(tmp_path):
    msg = config_error(build(tmp_path, "gpt2"))
    assert "unsupported architecture 'gpt2'" in msg and "llama" in msg and "qwen2" in msg


@pytest.mark.parametrize("key", ["qwen2.block_count", "qwen2.embedding_length",
                                 "qwen2.attention.layer_norm_rms_epsilon", "qwen2.context_length"])
def test_missing_key(tmp_path, key):
    msg = config_error(build(tmp_path, edit=lambda md, ts: md.pop(key)))
    assert f"missing metadata key '{key}'" in msg


def test_wrong_tensor_shape(tmp_path):
    def edit(md, ts):
        i = next(i for i, t in enumerate(ts) if t[0] == "blk.1.attn_k.weight")
        ts[i] = ("blk.1.attn_k.weight", QT.Q8_0, (64, 256))
    msg = config_error(build(tmp_path, edit=edit))
    assert "'blk.1.attn_k.weight' has shape [64, 256], expected [128, 256]" in msg


def test_missing_tensor(tmp_path):
    msg = config_error(build(tmp_path, edit=lambda md, ts: ts.remove(
        next(t for t in ts if t[0] == "blk.0.ffn_up.weight"))))
    assert "missing tensor 'blk.0.ffn_up.weight'" in msg


def test_inconsistent_heads(tmp_path):
    msg = config_error(build(tmp_path, edit=lambda md, ts: md.update({"qwen2.attention.head_count_kv": 3})))
    assert "4 attention heads cannot share 3 KV heads" in msg


def test_partial_rope(tmp_path):
    msg = config_error(build(tmp_path, edit=lambda md, ts: md.update({"qwen2.rope.dimension_count": 32})))
    assert "partial RoPE" in msg


def test_bad_value_type(tmp_path):
    msg = config_error(build(tmp_path, edit=lambda md, ts: md.update({"qwen2.block_count": "two"})))
    assert "'qwen2.block_count' has bad value 'two'" in msg
