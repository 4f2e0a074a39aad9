"""The embedding lookup (``prefill.dequant_raw.embed_rows``, the plugin's ``minfer_embed_candidates``)
against gguf's own numpy dequantizer: every served type, ids repeated and out of order, the table's
first and last rows, one id and many; an id out of range reads no byte outside the table (the engine
refuses such ids before any kernel runs). Plain Triton: also under the CPU interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

SERVED = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _gguf_rows(table: torch.Tensor, qt, ids: list[int]) -> torch.Tensor:
    return torch.from_numpy(gguf_quants.dequantize(table.cpu().numpy()[ids], qt).astype(np.float32))


@pytest.mark.parametrize("qt", SERVED, ids=lambda q: q.name)
def test_embed_rows_match_gguf(qt):
    from minfer_mmq_triton.prefill.dequant_raw import embed_rows
    from minfer_mmq_triton.synth import random_raw

    vocab, k = 50, 512 if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 288
    table = random_raw(qt, vocab, k, DEV, 3)
    for ids in ([7], [49, 0, 7, 7, 31, 2, 49, 13, 5, 6, 8, 9, 10, 11, 12, 14, 15, 16, 1]):
        got = embed_rows(table, qt, k, torch.tensor(ids, device=DEV))
        want = _gguf_rows(table, qt, ids)
        assert got.dtype == torch.float32 and got.shape == (len(ids), k)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_embed_rows_other_types_take_the_core_dequantizer():
    from minfer_core.dequant import dequantize
    from minfer_mmq_triton.prefill.dequant_raw import EMBED_TYPES, embed_rows

    assert QT.F16 not in EMBED_TYPES
    table = torch.randn(10, 64).half().view(torch.uint8).to(DEV)
    ids = torch.tensor([3, 9], device=DEV)
    assert torch.equal(embed_rows(table, QT.F16, 64, ids), dequantize(table[ids], QT.F16, 64))


def test_embed_rows_clamp_ids_to_the_table():
    from minfer_mmq_triton.prefill.dequant_raw import embed_rows
    from minfer_mmq_triton.synth import random_raw

    table = random_raw(QT.Q8_0, 4, 64, DEV, 1)
    got = embed_rows(table, QT.Q8_0, 64, torch.tensor([-5, 4, 1000], device=DEV))
    want = _gguf_rows(table, QT.Q8_0, [0, 3, 3])
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6 * want.abs().max().item())


def test_the_plugin_offers_it():
    from minfer_mmq_triton import plugin

    (c,) = plugin.minfer_embed_candidates(None)
    assert c.plugin == "mmq_triton" and c.label == "mmq.embed"
