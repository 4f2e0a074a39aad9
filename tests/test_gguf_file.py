"""The GGUF reader against gguf's own ``GGUFReader``, and every kind of bad file."""

from __future__ import annotations

import mmap
import struct
import time
import warnings

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT, GGUFReader, GGUFWriter, quants as gq

from minfer_core.errors import UserError
from minfer_core.gguf_file import ModelFileError, open_gguf


@pytest.fixture(scope="module", params=["smollm", "qwen"])
def real_pair(request):
    path = request.getfixturevalue(f"{request.param}_path")
    return open_gguf(path), GGUFReader(path)


def test_matches_gguf_reader(real_pair):
    f, r = real_pair
    assert f.arch == r.fields["general.architecture"].contents()
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert list(f.metadata) == keys
    for k in keys:
        want = r.fields[k].contents()
        assert f.metadata[k] == want, k
    assert list(f.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        e = f.tensors[t.name]
        assert e.qtype == t.tensor_type
        assert e.shape == tuple(int(d) for d in reversed(t.shape))
        assert e.data.dtype == np.uint8 and e.data.shape[:-1] == e.shape[:-1]
        assert np.array_equal(e.data.reshape(-1), t.data.reshape(-1).view(np.uint8)), t.name


def test_tensor_data_is_mapped_not_copied(qwen_path):
    f = open_gguf(qwen_path)
    e = f.tensors["blk.0.ffn_down.weight"]
    assert e.data.shape == (896, 4864 // 256 * 210)
    base = e.data
    while isinstance(base, np.ndarray):
        assert not base.flags.owndata
        base = base.base
    assert isinstance(getattr(base, "obj", base), mmap.mmap)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # writable (copy-on-write) views: no torch warning
        torch.from_numpy(e.data)


def test_open_is_fast_and_get(qwen_path):
    t0 = time.perf_counter()
    f = open_gguf(qwen_path)
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0, f"open_gguf took {elapsed:.2f} s"  # ~0.2 s measured; 10 s with GGUFReader
    assert len(f.get("tokenizer.ggml.tokens")) == 151936
    assert f.get("qwen2.block_count") == 24
    assert f.get("no.such.key", 7) == 7
    with pytest.raises(ModelFileError) as ei:
        f.get("no.such.key")
    assert str(ei.value) == f"{qwen_path}: missing metadata key 'no.such.key'"


# -- small files built with gguf.GGUFWriter ------------------------------------------------------

def write_small(path, *, arch="qwen2"):
    """A valid small GGUF: one Q8_0 matrix, one F32 vector, a few metadata types."""
    rng = np.random.default_rng(0)
    mat = rng.standard_normal((4, 64)).astype(np.float32)
    w = GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ü"])
    w.add_tensor("mat.weight", gq.quantize(mat, QT.Q8_0), raw_dtype=QT.Q8_0)
    w.add_tensor("vec.weight", rng.standard_normal(48).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return mat


def test_small_file_roundtrip(tmp_path):
    p = tmp_path / "small.gguf"
    mat = write_small(p)
    f = open_gguf(p)
    assert f.metadata["tokenizer.ggml.tokens"] == ["a", "b", "ü"]
    assert f.metadata["tokenizer.ggml.add_bos_token"] is False
    assert f.get("qwen2.block_count") == 1
    m = f.tensors["mat.weight"]
    assert (m.qtype, m.shape, m.data.shape) == (QT.Q8_0, (4, 64), (4, 68))
    assert np.array_equal(gq.dequantize(m.data, QT.Q8_0), gq.dequantize(gq.quantize(mat, QT.Q8_0), QT.Q8_0))
    assert f.tensors["vec.weight"].data.shape == (48 * 4,)


def patch_tensor_info(path, name: str, *, type_id=None, ne0=None) -> None:
    """Rewrite a field of ``name``'s tensor-info record in place."""
    buf = bytearray(path.read_bytes())
    at = buf.index(name.encode()) + len(name)  # the name is followed by n_dims, ne[], type
    (n_dims,) = struct.unpack_from("<I", buf, at)
    if ne0 is not None:
        struct.pack_into("<Q", buf, at + 4, ne0)
    if type_id is not None:
        struct.pack_into("<I", buf, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(buf))


def expect_error(path, *fragments: str) -> str:
    with pytest.raises(ModelFileError) as ei:
        open_gguf(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg
    for frag in fragments:
        assert frag in msg, msg
    assert isinstance(ei.value, UserError)  # the CLI prints it as one line
    return msg


def test_not_found(tmp_path):
    expect_error(tmp_path / "nope.gguf", "file not found")


def test_not_gguf(tmp_path):
    p = tmp_path / "text.gguf"
    p.write_text("hello, I am not a model\n")
    expect_error(p, "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    expect_error(empty, "not a GGUF file")
    expect_error(tmp_path, "directory")


def test_truncated_header(tmp_path):
    p = tmp_path / "cut.gguf"
    write_small(p)
    data = p.read_bytes()
    for cut in (8, 40, data.index(b"vec.weight") + 4):  # in counts, in metadata, in tensor table
        p.write_bytes(data[:cut])
        expect_error(p, "truncated")


def test_truncated_tensor_data(tmp_path, qwen_path):
    p = tmp_path / "cut.gguf"
    with open(qwen_path, "rb") as fh:  # header (~5.9 MB) and part of the first tensor
        p.write_bytes(fh.read(6_500_000))
    expect_error(p, "truncated", "'output.weight'")


def test_unknown_tensor_type(tmp_path):
    p = tmp_path / "unknown.gguf"
    write_small(p)
    patch_tensor_info(p, "mat.weight", type_id=250)
    expect_error(p, "'mat.weight'", "unknown tensor type id 250")


def test_unsupported_tensor_type(tmp_path):
    p = tmp_path / "iq.gguf"
    write_small(p)
    patch_tensor_info(p, "mat.weight", type_id=int(QT.IQ2_XXS))
    expect_error(p, "'mat.weight'", "unsupported tensor type IQ2_XXS")


def test_bad_shape(tmp_path):
    p = tmp_path / "shape.gguf"
    write_small(p)
    patch_tensor_info(p, "mat.weight", ne0=48)  # not a whole number of 32-value Q8_0 blocks
    expect_error(p, "'mat.weight'", "bad shape [48, 4]", "Q8_0")


def test_bad_version(tmp_path):
    p = tmp_path / "v.gguf"
    write_small(p)
    buf = bytearray(p.read_bytes())
    struct.pack_into("<I", buf, 4, 1)
    p.write_bytes(bytes(buf))
    expect_error(p, "unsupported GGUF version 1")
    struct.pack_into(">I", buf, 4, 3)
    p.write_bytes(bytes(buf))
    expect_error(p, "big-endian")


def test_missing_architecture(tmp_path):
    p = tmp_path / "noarch.gguf"
    write_small(p)
    buf = p.read_bytes().replace(b"general.architecture", b"general.architectur_")
    p.write_bytes(buf)
    expect_error(p, "missing metadata key 'general.architecture'")
