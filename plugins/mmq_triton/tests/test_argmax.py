"""The greedy pick (``ops.argmax.argmax_rows``) against ``torch.argmax``, which the engines took
before and whose choice every greedy token must keep: ties to the lowest index, a NaN as the
largest, rows alone whatever else is in the batch (plain Triton, so also under the CPU interpreter)."""

from __future__ import annotations

import pytest
import torch


def _dev():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("V", [1, 100, 2048, 2049, 151_936])
def test_argmax_rows_matches_torch(V):
    from minfer_mmq_triton.ops.argmax import argmax_rows

    gen = torch.Generator().manual_seed(V)
    x = torch.randn(5, V, generator=gen)
    x[1] = x[1].round()  # many ties: the first one wins
    x[2] = 0.0  # one value everywhere: index 0
    x[3] = -float("inf")
    if V > 7:
        x[4, V - 1] = x[4].max() + 1  # the very last logit
    x = x.to(_dev())
    got = argmax_rows(x)
    assert got.dtype == torch.int64 and got.tolist() == x.argmax(dim=-1).tolist()
    assert argmax_rows(x[1]).tolist() == [int(x[1].argmax())]  # one row given as (V,)


def test_argmax_rows_nan_and_inf_like_torch():
    from minfer_mmq_triton.ops.argmax import argmax_rows

    V = 5000
    x = torch.zeros(4, V)
    x[0, 4100], x[0, 3000] = float("nan"), float("inf")  # a NaN counts as the largest
    x[1, 10], x[1, 4500] = float("inf"), float("inf")
    x[2, 4999], x[2, 2], x[2, 3] = 1.0, float("nan"), float("nan")
    x[3, 2048] = 1e-30
    x = x.to(_dev())
    assert argmax_rows(x).tolist() == x.argmax(dim=-1).tolist() == [4100, 10, 2, 2048]


def test_argmax_rows_a_row_alone_or_among_others():
    from minfer_mmq_triton.ops.argmax import argmax_rows

    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 70_000, generator=gen) * 4).round().to(_dev())  # ties across blocks
    together = argmax_rows(x).tolist()
    assert together == [int(argmax_rows(x[i:i + 1])) for i in range(9)] == x.argmax(dim=-1).tolist()
    assert argmax_rows(x[::2]).tolist() == together[::2]  # strided rows
