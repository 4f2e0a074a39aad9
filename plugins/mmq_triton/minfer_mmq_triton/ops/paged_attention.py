"""Decode attention for a batch of sequences over a paged KV pool, label ``mmq.attn.paged``.

``fn(q, k_pages, v_pages, block_tables, seq_lens) -> out``: ``q`` ``(B, H, D)`` (any float dtype),
the pool of one layer as ``(n_blocks, PAGE, Hkv, D)`` float16 pages (contiguous), ``block_tables``
``(B, max_blocks)`` int32 (each sequence's blocks in order), ``seq_lens`` ``(B,)`` int32 (valid
positions, the current token's included), ``out`` ``(B, H * D)`` float32. Shapes alone fix both
grids, so a step can be captured in a CUDA graph.

The same two passes as the single-sequence kernel (:mod:`.attention`, whose tile step and partials'
store it shares), with one more grid axis for the sequence: pass 1, grid ``(B * Hkv, NSPLIT)``,
spreads each sequence's valid positions over its ``NSPLIT`` splits and reads each key row through the
block table; pass 2, grid ``(B * H, DP / DC)``, combines a head's splits (the combine kernel of
:mod:`.attention`, shared). ``NSPLIT`` is fixed per instance, never derived from ``B``: a sequence's
result is the same bits whatever else is in the batch (batch invariance).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from minfer_core.weights import Candidate

from ..launch.pdl import enter, launch_args
from .attention import attend_tile, attn_combine_kernel, store_partials

PLUGIN = "mmq_triton"
LABEL = "mmq.attn.paged"
LOG2E = 1.4426950408889634
#: Splits per sequence and KV head for engines of more than FEW_SPLITS_ABOVE sequences (the other
#: entries already fill the GPU): H200, 7B heads (``decode_depth.py --parts paged``), 4 splits vs 16
#: take 10.9 vs 18.1 us a layer at B=32 and 200 positions, 26.2 vs 31.3 at 1,024, 72.6 vs 81.2 at
#: 4,096; 37.6 vs 64.0 / 88.4 vs 105.4 / 269.7 vs 298.5 at B=128; but 24.8 vs 10.0 us for one
#: sequence at 4,096, so small engines keep 16. With 4 splits the combine runs one program of one
#: warp per head (all of its dims) instead of four of four warps: 28.9 vs 37.5 us a layer at B=128
#: and 200 positions, 8.7 vs 10.9 at B=32 (with 16 splits it loses: 5.9 vs 5.4 at B=1).
FEW_SPLITS, FEW_SPLITS_ABOVE, FEW_SPLITS_COMBINE = 4, 16, (128, 1)


@triton.jit
def _paged_split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, len_ptr, o_ptr, m_ptr, l_ptr,
    stride_bt, stride_kt, stride_kh, stride_vt, stride_vh, qk_scale,
    HKV: tl.constexpr, REP: tl.constexpr, REP_P: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT: tl.constexpr, PDL: tl.constexpr,
):
    enter(PDL)
    b = tl.program_id(0) // HKV
    g = tl.program_id(0) % HKV
    s = tl.program_id(1)
    nv = tl.load(len_ptr + b)
    share = tl.cdiv(tl.cdiv(nv, NSPLIT), BLOCK_S) * BLOCK_S
    lo = s * share
    hi = tl.minimum(lo + share, nv)
    r = tl.arange(0, REP_P)
    dd = tl.arange(0, DP)
    dmask = dd < D
    heads = g * REP + r
    hmask = r < tl.where(lo < nv, REP, 0)  # a split past the valid positions neither loads nor stores
    q = tl.load(q_ptr + (b * HKV * REP + heads)[:, None] * D + dd[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)
    q = (q.to(tl.float32) * qk_scale).to(tl.float16)
    m_i = tl.full([REP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([REP_P], dtype=tl.float32)
    acc = tl.zeros([REP_P, DP], dtype=tl.float32)
    t0 = tl.arange(0, BLOCK_S)
    for start in range(lo, hi, BLOCK_S):
        t = start + t0
        tmask = t < hi
        page = tl.load(bt_ptr + b * stride_bt + t // PAGE, mask=tmask, other=0)
        row = page.to(tl.int64) * PAGE + t % PAGE
        m_i, l_i, acc = attend_tile(q, k_ptr, v_ptr, row, stride_kt, stride_vt, g * stride_kh, g * stride_vh, dd,
                                    tmask, dmask, m_i, l_i, acc)
    store_partials(o_ptr, m_ptr, l_ptr, (b * HKV * REP + heads) * NSPLIT + s, dd, hmask, acc, m_i, l_i, DP)


class PagedDecodeAttention:
    """The batched decode attention callable; its partial-result scratch is kept per shape. ``pdl``:
    both kernels launch with programmatic dependent launch (``launch.pdl``)."""

    def __init__(self, nsplit: int = 16, block_s: int = 64, num_warps: int = 4, dc: int = 32, ch: int = 16,
                 combine_warps: int = 4, pdl: bool = False):
        self.nsplit, self.block_s, self.num_warps, self.dc, self.ch = nsplit, block_s, num_warps, dc, ch
        self.combine_warps, self.pdl = combine_warps, pdl
        self._scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def for_engine(self, parallel: int) -> "PagedDecodeAttention":
        """The callable for a batched engine of at most ``parallel`` sequences (fixed for its life,
        so a sequence's bits still never depend on the batch): fewer splits for big engines."""
        if parallel <= FEW_SPLITS_ABOVE or self.nsplit <= FEW_SPLITS:
            return self
        dc, warps = FEW_SPLITS_COMBINE
        return PagedDecodeAttention(FEW_SPLITS, self.block_s, self.num_warps, dc, self.ch, warps, self.pdl)

    def _buffers(self, rows: int, dp: int, device) -> tuple[torch.Tensor, ...]:
        key = (rows, dp, str(device))
        if key not in self._scratch:
            self._scratch[key] = (torch.empty(rows * self.nsplit, dp, dtype=torch.float32, device=device),
                                  torch.empty(rows * self.nsplit, dtype=torch.float32, device=device),
                                  torch.empty(rows * self.nsplit, dtype=torch.float32, device=device))
        return self._scratch[key]

    def __call__(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        bsz, h, d = q.shape
        page, n_kv = k_pages.shape[1], k_pages.shape[2]
        if page & (page - 1) or not (k_pages.is_contiguous() and v_pages.is_contiguous()):
            raise ValueError("k/v pages must be contiguous (n_blocks, PAGE, Hkv, D) with PAGE a power of two")
        k_pool, v_pool = k_pages.flatten(0, 1), v_pages.flatten(0, 1)
        q = q.contiguous()
        bt = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        dp = max(16, triton.next_power_of_2(d))
        dc = min(self.dc, dp)
        rep = h // n_kv
        o_part, m_part, l_part = self._buffers(bsz * h, dp, q.device)
        out = torch.empty(bsz, h * d, dtype=torch.float32, device=q.device)
        _paged_split_kernel[(bsz * n_kv, self.nsplit)](
            q, k_pool, v_pool, bt, lens, o_part, m_part, l_part,
            bt.stride(0), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            LOG2E / math.sqrt(d), HKV=n_kv, REP=rep, REP_P=max(16, triton.next_power_of_2(rep)), D=d, DP=dp,
            PAGE=page, BLOCK_S=self.block_s, NSPLIT=self.nsplit, num_warps=self.num_warps, **launch_args(self.pdl),
        )
        attn_combine_kernel[(bsz * h, dp // dc)](
            o_part, m_part, l_part, lens, out, out, out, out, out, H=h, D=d, DP=dp, DC=dc, NSPLIT=self.nsplit,
            BLOCK_S=self.block_s, CH=min(self.nsplit, self.ch), num_warps=self.combine_warps,
            **launch_args(self.pdl),
        )
        return out


def paged_candidate(pdl: bool = False) -> Candidate:
    return Candidate(PLUGIN, LABEL, PagedDecodeAttention(pdl=pdl))
