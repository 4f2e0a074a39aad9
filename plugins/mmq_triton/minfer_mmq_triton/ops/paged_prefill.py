"""Prompt attention for a batch of sequences over a paged KV pool, label ``mmq.attn.paged_prefill``.

``fn(q, k_pages, v_pages, calls, block_tables, out, max_rows)``: ``q`` ``(T, H, D)`` (any float
dtype), the pool of one layer as ``(n_blocks, PAGE, Hkv, D)`` float16 pages, ``calls`` ``(C, 4)``
int32 (first row, row count, first position, row of ``block_tables``), ``block_tables`` ``(S,
max_blocks)`` int32, ``out`` ``(T, H * D)`` float32, ``max_rows`` the most rows of any call (a host
int: it sizes the grid). Row ``i`` of a call sits at position ``first + i`` and sees every key of its
sequence up to itself; the call's rows of ``out`` are written, no other.

One launch for every call of a step: grid ``(C * ceil(max_rows / BLOCK_M), H)``, a program per
block of ``BLOCK_M`` query rows of one call and one query head, flash attention over the call's
keys in ``BLOCK_N`` steps read through the block table (online softmax in base 2, float16 operands,
float32 accumulation). A program's keys end at its last row's position, and rows past their own
position mask the rest to nothing, so a row's result depends on its call alone: the same bits
whatever else the step holds (batch invariance).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minfer_core.weights import Candidate

PLUGIN = "mmq_triton"
LABEL = "mmq.attn.paged_prefill"
LOG2E = 1.4426950408889634
BLOCK_M, BLOCK_N, NUM_WARPS = 64, 64, 4


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, calls_ptr, bt_ptr, o_ptr,
    stride_qt, stride_bt, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, qk_scale,
    REP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QBLOCKS: tl.constexpr, F32_DOT: tl.constexpr,
):
    c = tl.program_id(0) // QBLOCKS
    qb = tl.program_id(0) % QBLOCKS
    h = tl.program_id(1)
    g = h // REP
    r0 = tl.load(calls_ptr + 4 * c)
    nr = tl.load(calls_ptr + 4 * c + 1)
    p0 = tl.load(calls_ptr + 4 * c + 2)
    table = bt_ptr + tl.load(calls_ptr + 4 * c + 3).to(tl.int64) * stride_bt
    if qb * BLOCK_M < nr:
        rows = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < nr
        qpos = p0 + rows
        dd = tl.arange(0, DP)
        dmask = dd < D
        q = tl.load(q_ptr + (r0 + rows).to(tl.int64)[:, None] * stride_qt + h * D + dd[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        q = q.to(tl.float32) if F32_DOT else q.to(tl.float16)
        hi = p0 + tl.minimum(nr, (qb + 1) * BLOCK_M)  # keys past the last row's position: none
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, DP), tl.float32)
        for start in range(0, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pmask = pos < hi
            blk = tl.load(table + pos // PAGE, mask=pmask, other=0).to(tl.int64)
            slot = blk * PAGE + pos % PAGE
            kv_mask = pmask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + slot[:, None] * stride_kt + g * stride_kh + dd[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + slot[:, None] * stride_vt + g * stride_vh + dd[None, :], mask=kv_mask, other=0.0)
            if F32_DOT:
                k, v = k.to(tl.float32), v.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where((pos[None, :] <= qpos[:, None]) & pmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            p = p.to(tl.float32) if F32_DOT else p.to(tl.float16)
            acc = acc * alpha[:, None] + tl.dot(p, v)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + (r0 + rows).to(tl.int64)[:, None] * stride_ot + h * D + dd[None, :], out,
                 mask=rmask[:, None] & dmask[None, :])


def paged_prefill(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, calls: torch.Tensor,
                  block_tables: torch.Tensor, out: torch.Tensor, max_rows: int) -> torch.Tensor:
    """Every call's rows of ``out`` (see the module docstring); returns ``out``."""
    t, h, d = q.shape
    n_blocks, page, n_kv, _ = k_pages.shape
    if k_pages.stride(-1) != 1 or v_pages.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("pages and out must be contiguous in the head dimension")
    q = q if q.stride(-1) == 1 and q.stride(1) == d else q.contiguous()
    kf, vf = k_pages.view(n_blocks * page, n_kv, d), v_pages.view(n_blocks * page, n_kv, d)
    n_calls = calls.shape[0]
    if n_calls == 0 or max_rows == 0:
        return out
    qblocks = triton.cdiv(max_rows, BLOCK_M)
    _paged_prefill_kernel[(n_calls * qblocks, h)](
        q, kf, vf, calls, block_tables, out,
        q.stride(0), block_tables.stride(0), kf.stride(0), kf.stride(1), vf.stride(0), vf.stride(1), out.stride(0),
        LOG2E / math.sqrt(d),
        REP=h // n_kv, D=d, DP=max(16, triton.next_power_of_2(d)), PAGE=page,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, QBLOCKS=qblocks, F32_DOT=not q.is_cuda, num_warps=NUM_WARPS,
    )
    return out


def paged_prefill_candidate() -> Candidate:
    return Candidate(PLUGIN, LABEL, paged_prefill)
