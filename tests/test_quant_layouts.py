"""The block byte layouts in ``minfer_core.quants.BLOCK_FIELDS`` (what kernels take offsets from)
against gguf: the fields tile gguf's block size, and gguf's own quantizer writes d and qs there."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, quants as gq

from minfer_core.quants import BLOCK_FIELDS, SUPPORTED, field


@pytest.mark.parametrize("qtype", list(BLOCK_FIELDS), ids=lambda t: t.name)
def test_fields_tile_the_block(qtype):
    spans = sorted(BLOCK_FIELDS[qtype].values())
    at = 0
    for off, size in spans:
        assert off == at, (qtype.name, spans)
        at += size
    assert at == GGML_QUANT_SIZES[qtype][1]


def test_every_quantized_type_has_a_layout():
    assert {t for t in SUPPORTED if GGML_QUANT_SIZES[t][0] > 1} == set(BLOCK_FIELDS)


def test_q8_0_fields_hold_what_gguf_writes():
    x = np.linspace(-3.0, 5.0, 64, dtype=np.float32).reshape(2, 32)
    blocks = gq.quantize(x, QT.Q8_0).reshape(2, -1)
    d_at, _ = field(QT.Q8_0, "d")
    qs_at, qs_n = field(QT.Q8_0, "qs")
    d = blocks[:, d_at:d_at + 2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, qs_at:qs_at + qs_n].view(np.int8).astype(np.float32)
    np.testing.assert_allclose(d[:, 0], np.abs(x).max(axis=1) / 127, rtol=1e-3)
    np.testing.assert_allclose(d * q, x, atol=float(d.max()))
