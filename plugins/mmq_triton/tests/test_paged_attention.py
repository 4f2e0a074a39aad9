"""The paged batched decode attention against plain float64 softmax attention over each
sequence's gathered K/V; a sequence's output does not depend on the rest of the batch."""

from __future__ import annotations

import math

import pytest
import torch

from minfer_mmq_triton.ops.paged_attention import PagedDecodeAttention


def make_batch(lens, h, hkv, d, page, device="cpu", seed=0):
    """Random q and a pool whose blocks are handed out to the sequences in shuffled order."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // page) for n in lens]
    n_rows = (sum(blocks) + 3) * page
    k = torch.randn(n_rows, hkv, d, generator=gen).half()
    v = torch.randn(n_rows, hkv, d, generator=gen).half()
    order = torch.randperm(n_rows // page, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    for i, nb in enumerate(blocks):
        tables[i, :nb] = torch.tensor([order.pop() for _ in range(nb)], dtype=torch.int32)
    q = torch.randn(len(lens), h, d, generator=gen)
    to = lambda t: t.to(device)  # noqa: E731
    pages = lambda t: t.view(-1, page, hkv, d)  # noqa: E731
    return to(q), to(pages(k)), to(pages(v)), to(tables), to(torch.tensor(lens, dtype=torch.int32))


def oracle(q, k, v, tables, lens, page):
    out = []
    for b, n in enumerate(lens.tolist()):
        rows = torch.cat([torch.arange(p * page, p * page + page) for p in tables[b].tolist()])[:n]
        kf, vf = k.flatten(0, 1), v.flatten(0, 1)
        kb, vb = kf[rows.to(k.device)].double(), vf[rows.to(k.device)].double()  # (n, Hkv, D)
        rep = q.shape[1] // k.shape[2]
        kb, vb = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
        s = torch.einsum("hd,nhd->hn", q[b].double(), kb) / math.sqrt(q.shape[2])
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), vb).reshape(-1))
    return torch.stack(out).float()


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


#: the default callable (four splits here) and what a big engine attends with (one-warp combine)
CALLABLES = [PagedDecodeAttention(nsplit=4), PagedDecodeAttention().for_engine(128)]


@pytest.mark.parametrize("att", CALLABLES)
@pytest.mark.parametrize("lens", [[1], [5, 70, 16, 33], [200, 1, 64]])
def test_paged_matches_oracle(lens, att):
    q, k, v, tables, n = make_batch(lens, 8, 2, 32, 16)
    out = att(q, k, v, tables, n)
    assert rel(out, oracle(q, k, v, tables, n, 16)) < 2e-3


@pytest.mark.parametrize("att", CALLABLES)
def test_a_sequence_alone_equals_it_in_a_batch(att):
    q, k, v, tables, n = make_batch([40, 97, 3, 128], 8, 2, 32, 16, seed=3)
    together = att(q, k, v, tables, n)
    for b in range(4):
        alone = att(q[b:b + 1], k, v, tables[b:b + 1], n[b:b + 1])
        assert torch.equal(alone[0], together[b])


def test_rows_outside_the_tables_are_never_read():
    q, k, v, tables, n = make_batch([20, 35], 8, 2, 32, 16, seed=4)
    att = PagedDecodeAttention(nsplit=4)
    a = att(q, k, v, tables, n)
    used = {p * 16 + i for b, m in enumerate(n.tolist()) for j, p in enumerate(tables[b].tolist())
            for i in range(16) if j * 16 + i < m}
    kf, vf = k.view(-1, *k.shape[2:]), v.view(-1, *v.shape[2:])
    for r in range(kf.shape[0]):
        if r not in used:
            kf[r], vf[r] = float("nan"), float("inf")
    assert torch.equal(att(q, k, v, tables, n), a)


@pytest.mark.cuda
@pytest.mark.parametrize("engine", [1, 128])  # what an engine of this size attends with
@pytest.mark.parametrize("bsz", [1, 8, 128])
def test_paged_real_shapes_cuda(bsz, engine):
    lens = [(37 * i) % 700 + 1 for i in range(bsz)]
    q, k, v, tables, n = make_batch(lens, 28, 4, 128, 16, device="cuda", seed=bsz)
    att = PagedDecodeAttention().for_engine(engine)
    out = att(q, k, v, tables, n)
    assert rel(out, oracle(q, k, v, tables, n, 16)) < 2e-3
    assert torch.equal(att(q[:1], k, v, tables[:1], n[:1])[0], out[0])


def test_offered_as_the_paged_decode_attention_phase():
    from minfer_mmq_triton.ops.attention import attention_candidates

    (c,) = attention_candidates("paged_decode", None)
    assert c.label == "mmq.attn.paged" and isinstance(c.fn, PagedDecodeAttention)
