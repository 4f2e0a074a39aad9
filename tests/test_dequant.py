"""The torch dequantizers against gguf's own numpy reference (``gguf.quants.dequantize``).

Tolerance: none. Every comparison is bit-exact (float32 bit patterns equal), on random blocks
of every supported type and on rows of the real models' tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT, quants as gq

from minfer_core import dequant as dq
from minfer_core.dequant import dequantize
from minfer_core.gguf_file import open_gguf
from minfer_core.quants import QUANTS, SUPPORTED

#: Byte offsets of the f16 scale fields in each block (must be finite for a valid block).
F16_FIELDS = {
    QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
    QT.Q2_K: (80, 82), QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,),
}


def random_rows(qtype: QT, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Random bytes shaped ``(rows, row_bytes)`` with finite f16 scales (floats: finite values)."""
    rng = np.random.default_rng(seed)
    q = QUANTS[qtype]
    n = rows * blocks_per_row
    if qtype in (QT.F32, QT.F16):
        vals = rng.standard_normal(n * q.block_size).astype(np.float32 if qtype == QT.F32 else np.float16)
        return vals.view(np.uint8).reshape(rows, -1)
    b = rng.integers(0, 256, (n, q.type_size), dtype=np.uint8)
    if qtype == QT.BF16:  # random high halves of finite float32s
        f = rng.standard_normal(n * q.block_size).astype(np.float32).view(np.uint32) >> 16
        b = f.astype(np.uint16).view(np.uint8).reshape(n, q.type_size)
    for at in F16_FIELDS.get(qtype, ()):
        scale = rng.standard_normal(n) * np.exp(rng.uniform(-8, 2, n))
        b[:, at:at + 2] = scale.astype(np.float16).view(np.uint8).reshape(n, 2)
    return b.reshape(rows, -1)


def assert_bits_equal(got: torch.Tensor, ref: np.ndarray) -> None:
    got = got.cpu().numpy()
    assert got.dtype == np.float32 and got.shape == ref.shape
    ref = ref.astype(np.float32, copy=False)
    assert np.isfinite(got).all()
    bad = got.view(np.uint32) != ref.view(np.uint32)
    assert not bad.any(), f"{bad.sum()} of {bad.size} values differ, e.g. {got[bad][:4]} vs {ref[bad][:4]}"


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_random_blocks_match_gguf(qtype):
    raw = random_rows(qtype, rows=7, blocks_per_row=3, seed=int(qtype))
    n_cols = 3 * QUANTS[qtype].block_size
    assert_bits_equal(dequantize(torch.from_numpy(raw), qtype, n_cols), gq.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_1, QT.Q3_K, QT.Q6_K], ids=lambda t: t.name)
def test_leading_dims_and_chunking(qtype, monkeypatch):
    raw = random_rows(qtype, rows=12, blocks_per_row=2, seed=5)
    ref = gq.dequantize(raw, qtype)
    monkeypatch.setattr(dq, "CHUNK_BLOCKS", 5)  # 24 blocks -> 5 chunks, the last one short
    n_cols = 2 * QUANTS[qtype].block_size
    got = dequantize(torch.from_numpy(raw).reshape(3, 4, -1), qtype, n_cols)
    assert got.shape == (3, 4, n_cols)
    assert_bits_equal(got.reshape(12, n_cols), ref)


def test_non_contiguous_input():
    raw = random_rows(QT.Q8_0, rows=8, blocks_per_row=2, seed=9)
    t = torch.from_numpy(raw)[::2]  # every other row: strided view
    assert_bits_equal(dequantize(t, QT.Q8_0, 64), gq.dequantize(raw[::2].copy(), QT.Q8_0))


def test_bad_arguments():
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    with pytest.raises(ValueError, match="34"):
        dequantize(raw, QT.Q8_0, 64)  # 64 values take 68 bytes
    with pytest.raises(ValueError, match="multiple"):
        dequantize(raw, QT.Q8_0, 40)
    with pytest.raises(ValueError, match="uint8"):
        dequantize(raw.float(), QT.Q8_0, 32)
    with pytest.raises(KeyError, match="IQ2_XXS"):
        dequantize(raw, QT.IQ2_XXS, 256)


def _real_cases(path, per_type: int = 3):
    """A few tensors of each type present: their first and last 3 rows (all rows if 1-D)."""
    f = open_gguf(path)
    seen: dict[QT, int] = {}
    for e in f.tensors.values():
        if seen.get(e.qtype, 0) >= per_type:
            continue
        seen[e.qtype] = seen.get(e.qtype, 0) + 1
        rows = e.data if e.data.ndim == 1 else np.concatenate([e.data[:3], e.data[-3:]])
        yield e.name, e.qtype, e.shape[-1], np.ascontiguousarray(rows)


def test_real_qwen_tensors(qwen_path):
    types = set()
    for name, qtype, n_cols, rows in _real_cases(qwen_path):
        types.add(qtype)
        assert_bits_equal(dequantize(torch.from_numpy(rows), qtype, n_cols), gq.dequantize(rows, qtype))
    assert {QT.Q5_0, QT.Q8_0, QT.Q6_K, QT.Q4_K, QT.F32} <= types


def test_real_smollm_tensors(smollm_path):
    types = set()
    for name, qtype, n_cols, rows in _real_cases(smollm_path):
        types.add(qtype)
        assert_bits_equal(dequantize(torch.from_numpy(rows), qtype, n_cols), gq.dequantize(rows, qtype))
    assert QT.Q4_1 in types


def test_whole_tensor_q4k(qwen_path):
    """One whole tensor end to end (internal chunking on a real-sized input)."""
    e = next(t for t in open_gguf(qwen_path).tensors.values() if t.qtype == QT.Q4_K)
    assert_bits_equal(dequantize(torch.from_numpy(e.data), e.qtype, e.shape[-1]), gq.dequantize(e.data, e.qtype))


@pytest.mark.cuda
@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_cuda_matches_gguf(qtype):
    raw = random_rows(qtype, rows=64, blocks_per_row=4, seed=100 + int(qtype))
    n_cols = 4 * QUANTS[qtype].block_size
    got = dequantize(torch.from_numpy(raw).cuda(), qtype, n_cols)
    assert got.device.type == "cuda"
    assert_bits_equal(got, gq.dequantize(raw, qtype))
