"""Decode attention for GQA, split over the KV length (flash-decoding), label ``mmq.attn.splitkv``.

``attention_candidates("decode", ctx)`` offers ``fn(q, k_cache, v_cache, n_valid) -> out``:
``q`` ``(H, D)`` (any float dtype), caches ``(max_ctx, Hkv, D)`` float16 of one layer, ``n_valid``
a 0-d int32 device tensor, ``out`` ``(H * D,)`` float32. ``n_valid`` is read only inside the
kernels, and both grids depend only on shapes, so the call can be captured in a CUDA graph. Where
the int8 GEMVs run on tensor cores (``decode.mma_enabled``) ``out`` comes as an ``Activation``
whose ``forms`` hold it quantized too (``quant_x.FORM``, written by pass 2): the o projection's
GEMV reads that instead of launching the quantizer.

Pass 1, grid ``(Hkv, NSPLIT)``: program ``(g, s)`` takes the ``H / Hkv`` query heads sharing KV
head ``g`` (padded to 16 rows for ``tl.dot``) over its share of the valid positions. The share is
computed in the kernel from ``n_valid``: ``ceil(n_valid / NSPLIT)`` rounded up to ``BLOCK_S``, so
short and long contexts both spread over the splits, and a split past ``n_valid`` loads and stores
nothing. It writes the unnormalized output, the running max and the sum of exponentials (base 2)
per (head, split).
With ``rope`` (the candidate fuses ``"rope_kv"``) pass 1 also does the decode RoPE op's work: it
rotates q on load, and the split holding the new position writes its rotated k and v into the caches
and takes that position from registers (one launch a layer fewer).
Pass 2, grid ``(H, DP / DC)``: each program rescales the active splits of one head to a common max
for a ``DC``-wide slice of the head dimension, and divides.

``NSPLIT`` depends only on the device and the KV head count, never on the cache length, so a
step costs the same whatever context the engine was loaded with (what ran before it included).
Scores use float16 operands on the tensor cores with float32 accumulation (``q`` is rounded to
float16 once, probabilities once before ``P @ V``): about 1e-3 relative, the error of the
float16 cache itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
import triton
import triton.language as tl

from minfer_core.weights import Activation, Candidate

from ..launch.device import sm_count
from ..launch.pdl import enabled as pdl_enabled, enter, launch_args
from .quant_x import FORM, as_words, form_buffers, store_blocks
from .rope import check_token_rows

PLUGIN = "mmq_triton"
LABEL = "mmq.attn.splitkv"
LOG2E = 1.4426950408889634


@triton.jit
def attend_tile(q, k_ptr, v_ptr, row, stride_kt, stride_vt, k_head, v_head, dd, tmask, dmask, m_i, l_i, acc):
    """One tile of the online softmax over cache rows ``row`` [BLOCK_S] (``tmask`` the valid ones; a row
    of the head starts at ``k_ptr + row * stride_kt + k_head``, likewise V): the running max ``m_i``, sum
    of exponentials ``l_i`` (base 2: ``q`` carries log2(e)) and unnormalized output ``acc`` with the tile
    added. Shared by the single-sequence and the paged split kernels."""
    kvmask = tmask[:, None] & dmask[None, :]
    k = tl.load(k_ptr + row[:, None] * stride_kt + k_head + dd[None, :], mask=kvmask, other=0.0)
    sc = tl.dot(q, tl.trans(k))  # [REP_P, BLOCK_S] f32
    sc = tl.where(tmask[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(sc - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(v_ptr + row[:, None] * stride_vt + v_head + dd[None, :], mask=kvmask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
    return m_new, l_i, acc


@triton.jit
def store_partials(o_ptr, m_ptr, l_ptr, part, dd, hmask, acc, m_i, l_i, DP: tl.constexpr):
    """A split's partials of heads ``part`` (rows of the scratch; ``hmask`` the heads it stores): the
    unnormalized output, the running max and the sum, as the combine reads them."""
    tl.store(o_ptr + part[:, None] * DP + dd[None, :], acc, mask=hmask[:, None])
    tl.store(m_ptr + part, m_i, mask=hmask)
    tl.store(l_ptr + part, l_i, mask=hmask)


@triton.jit
def _attn_split_kernel(
    q_ptr, k_ptr, v_ptr, nv_ptr, o_ptr, m_ptr, l_ptr, kn_ptr, vn_ptr, cos_ptr, sin_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, qk_scale,
    REP: tl.constexpr, REP_P: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    BLOCK_S: tl.constexpr, NSPLIT: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr = 0,
):
    """Pass 1 (module docstring). ``ROPE`` 1 (neox) or 2 (normal): ``q`` is this token's unrotated row
    and ``kn``/``vn`` its K/V rows (``cos``/``sin`` the D/2 angles of position ``n_valid - 1``); every
    program rotates its q heads, and the split holding position ``n_valid - 1`` writes the rotated k and
    v there (float16) and takes that position from registers, not from the cache it just wrote."""
    enter(PDL)
    g = tl.program_id(0)
    s = tl.program_id(1)
    nv = tl.load(nv_ptr)
    share = tl.cdiv(tl.cdiv(nv, NSPLIT), BLOCK_S) * BLOCK_S
    lo = s * share
    hi = tl.minimum(lo + share, nv)
    r = tl.arange(0, REP_P)
    dd = tl.arange(0, DP)
    dmask = dd < D
    heads = g * REP + r
    hmask = r < tl.where(lo < nv, REP, 0)  # a split past the valid positions neither loads nor stores
    qmask = hmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + heads[:, None] * D + dd[None, :], mask=qmask, other=0.0).to(tl.float32)
    if ROPE:
        # a pair (a, b) turns into (a c - b s, a s + b c): each dimension reads its partner and the
        # pair's angle, and the sine carries the sign of its place in the pair
        if ROPE == 1:
            mate, j, first = (dd + D // 2) % D, dd % (D // 2), dd < D // 2
        else:
            mate, j, first = dd ^ 1, dd // 2, dd % 2 == 0
        c = tl.load(cos_ptr + j, mask=dmask, other=0.0)
        sn = tl.where(first, -1.0, 1.0) * tl.load(sin_ptr + j, mask=dmask, other=0.0)
        qm = tl.load(q_ptr + heads[:, None] * D + mate[None, :], mask=qmask, other=0.0)
        q = q * c[None, :] + qm * sn[None, :]
        kn = tl.load(kn_ptr + g * D + dd, mask=dmask, other=0.0) * c
        kn = (kn + tl.load(kn_ptr + g * D + mate, mask=dmask, other=0.0) * sn).to(tl.float16)
        vn = tl.load(vn_ptr + g * D + dd, mask=dmask, other=0.0).to(tl.float16)
        row = nv - 1
        own = (row >= lo) & (row < hi)
        omask = dd < tl.where(own, D, 0)
        tl.store(k_ptr + row * stride_kt + g * stride_kh + dd, kn, mask=omask)
        tl.store(v_ptr + row * stride_vt + g * stride_vh + dd, vn, mask=omask)
    q = (q * qk_scale).to(tl.float16)  # scale includes log2(e): exp2 below
    m_i = tl.full([REP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([REP_P], dtype=tl.float32)
    acc = tl.zeros([REP_P, DP], dtype=tl.float32)
    if ROPE:  # the new position first, from registers (weight exp2(0) = 1); the loop stops short of it
        m_i = tl.where(own, tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], axis=1), m_i)
        l_i = tl.where(own, 1.0, l_i)
        acc = tl.where(own, vn.to(tl.float32)[None, :] + acc, acc)
        hi = tl.minimum(hi, row)
    t0 = tl.arange(0, BLOCK_S)
    for start in range(lo, hi, BLOCK_S):
        t = start + t0
        tmask = t < hi
        m_i, l_i, acc = attend_tile(q, k_ptr, v_ptr, t, stride_kt, stride_vt, g * stride_kh, g * stride_vh, dd, tmask,
                                    dmask, m_i, l_i, acc)
    store_partials(o_ptr, m_ptr, l_ptr, heads * NSPLIT + s, dd, hmask, acc, m_i, l_i, DP)


@triton.jit
def _weigh(m, l, o, smask, m_all, num, den):
    """Add splits ``smask`` (their max ``m``, sum ``l``, output rows ``o``; other lanes ignored, whatever
    they hold) to the combine's running ``num`` [DC] and ``den`` [CH], weighed to the common max."""
    m = tl.where(smask, m, float("-inf"))
    w = tl.where(m > float("-inf"), tl.exp2(m - m_all), 0.0)
    num += tl.sum(w[:, None] * tl.where(smask[:, None], o, 0.0), axis=0)
    den += w * tl.where(smask, l, 0.0)
    return num, den


@triton.jit
def attn_combine_kernel(o_ptr, m_ptr, l_ptr, nv_ptr, out_ptr, xh_ptr, xl_ptr, xs_ptr, x16_ptr,
                        H: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, DC: tl.constexpr, NSPLIT: tl.constexpr,
                        BLOCK_S: tl.constexpr, CH: tl.constexpr, PDL: tl.constexpr, FORM: tl.constexpr = False):
    """Row ``r`` (sequence ``r // H``'s head ``r % H``), dims ``c*DC ..``: weigh the splits that hold
    valid positions of that sequence (``nv_ptr[r // H]``), CH at a time, and normalize. Shared by the
    single-sequence and the paged kernels, whose pass 1 lays out the partials the same way.
    FORM (DC = 32): also write the slice as one block of ``quant_x.FORM`` (``xh_ptr`` ..), numbered
    over the whole output as ``out`` is (block ``(r D + c DC) / 32``)."""
    enter(PDL)
    r = tl.program_id(0)
    dd = tl.program_id(1) * DC + tl.arange(0, DC)
    # n_valid, every split's max and the first CH splits' partials load together (one round trip after
    # the wait); the splits past the valid positions hold stale values, masked once n_valid is known
    nv = tl.load(nv_ptr + r // H)
    sp = tl.arange(0, NSPLIT)
    m_each = tl.load(m_ptr + r * NSPLIT + sp)
    s = tl.arange(0, CH)
    m = tl.load(m_ptr + r * NSPLIT + s)
    l = tl.load(l_ptr + r * NSPLIT + s)
    o = tl.load(o_ptr + (r * NSPLIT + s)[:, None] * DP + dd[None, :])
    share = tl.cdiv(tl.cdiv(nv, NSPLIT), BLOCK_S) * BLOCK_S
    n_act = tl.cdiv(nv, share)  # splits past this one saw no position
    m_all = tl.max(tl.where(sp < n_act, m_each, float("-inf")), axis=0)
    num, den = _weigh(m, l, o, s < n_act, m_all, tl.zeros([DC], dtype=tl.float32), tl.zeros([CH], dtype=tl.float32))
    for c0 in range(CH, n_act, CH):
        s = c0 + tl.arange(0, CH)
        smask = s < n_act
        m = tl.load(m_ptr + r * NSPLIT + s, mask=smask)
        l = tl.load(l_ptr + r * NSPLIT + s, mask=smask)
        o = tl.load(o_ptr + (r * NSPLIT + s)[:, None] * DP + dd[None, :], mask=smask[:, None])
        num, den = _weigh(m, l, o, smask, m_all, num, den)
    res = num / tl.sum(den, axis=0)
    tl.store(out_ptr + r * D + dd, res, mask=dd < D)
    if FORM:
        b = (r * D + tl.program_id(1) * DC) // 32 + tl.arange(0, 1)
        store_blocks(tl.reshape(res, [1, 2, 16]), b, b >= 0, 0, 0, xh_ptr, xl_ptr, xs_ptr, x16_ptr)


def n_splits(n_kv: int, device: torch.device) -> int:
    """Splits per KV head: the largest power of two that keeps the grid within one program per
    multiprocessor (fewer, longer splits make the combine cheaper; measured best at depth)."""
    sms = sm_count(device)
    return max(1, min(1 << ((sms // n_kv).bit_length() - 1), 256)) if sms >= n_kv else 1


#: ``(BLOCK_S, num_warps)`` of the split kernel where the caller gives none: positions a loop step
#: and warps a program (``decode_depth.py --tiles`` measures others in the whole model).
DECODE_TILE = (64, 4)


class SplitKVAttention:
    """The decode attention callable; keeps its partial-result scratch per shape (graph friendly).
    ``pdl``: launch both kernels with programmatic dependent launch (see ``launch.pdl``). ``form``:
    return an :class:`~minfer_core.weights.Activation` whose ``forms`` also hold the output in
    ``quant_x.FORM``, written by the combine (the int8 GEMVs then skip their quantizing launch)."""

    def __init__(self, block_s: int | None = None, num_warps: int | None = None, pdl: bool = False,
                 nsplit: int | None = None, dc: int = 32, ch: int = 32, form: bool = False):
        self.block_s, self.num_warps = block_s or DECODE_TILE[0], num_warps or DECODE_TILE[1]
        self.pdl, self.form = pdl, form
        self.nsplit, self.dc, self.ch = nsplit, dc, ch  # None: n_splits() of the device
        self._scratch: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def _buffers(self, h: int, dp: int, nsplit: int, device) -> tuple[torch.Tensor, ...]:
        key = (h, dp, nsplit, str(device))
        buf = self._scratch.get(key)
        if buf is None:
            buf = (torch.empty(h * nsplit, dp, dtype=torch.float32, device=device),
                   torch.empty(h * nsplit, dtype=torch.float32, device=device),
                   torch.empty(h * nsplit, dtype=torch.float32, device=device))
            self._scratch[key] = buf
        return buf

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 n_valid: torch.Tensor, rope: tuple | None = None):
        """``rope=(k, v, cos, sin, neox)`` (``Candidate.fuses`` ``"rope_kv"``): ``q`` (H*D,) float32 is
        unrotated; RoPE and the write of row ``n_valid - 1`` (``rope_kv_write``'s contract) happen in
        the split kernel."""
        n_kv, d = k_cache.shape[1], k_cache.shape[2]
        q = q.reshape(-1, d)
        h = q.shape[0]
        rep = h // n_kv
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise ValueError("k/v cache rows must be contiguous in the head dimension")
        q = q.contiguous()
        nsplit = self.nsplit or n_splits(n_kv, q.device)
        dp = max(16, triton.next_power_of_2(d))
        style, kn, vn, cos, sin = 0, q, q, q, q  # the rope pointers, unread without ROPE
        if rope is not None:
            kn, vn, cos, sin, neox = rope
            check_token_rows("decode attention with RoPE", q, kn, vn, cos, sin, k_cache, v_cache)
            style = 1 if neox else 2
        dc = min(self.dc, dp)
        o_part, m_part, l_part = self._buffers(h, dp, nsplit, q.device)
        out = torch.empty(h * d, dtype=torch.float32, device=q.device)
        form = self.form and dc == 32 and d % 32 == 0
        xq = form_buffers(1, h * d, q.device) if form else (out,) * 4
        _attn_split_kernel[(n_kv, nsplit)](
            q, k_cache, v_cache, n_valid, o_part, m_part, l_part, kn, vn, cos, sin,
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            LOG2E / math.sqrt(d),
            REP=rep, REP_P=max(16, triton.next_power_of_2(rep)), D=d, DP=dp,
            BLOCK_S=self.block_s, NSPLIT=nsplit, ROPE=style, num_warps=self.num_warps, **launch_args(self.pdl),
        )
        attn_combine_kernel[(h, dp // dc)](o_part, m_part, l_part, n_valid, out, *xq, H=h, D=d, DP=dp, DC=dc,
                                           NSPLIT=nsplit, BLOCK_S=self.block_s, CH=min(nsplit, self.ch),
                                           num_warps=4, FORM=form, **launch_args(self.pdl))
        return Activation(out, forms={FORM: as_words(*xq)}) if form else out


def prefill_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                  plane: bool = False) -> torch.Tensor | Activation:
    """Causal GQA prefill attention through torch SDPA in f16 (cuDNN's or the flash kernel on the GPU).

    q (T, H, D) f32, k/v (start+T, Hkv, D) f16 from the cache -> (T, H*D) f32, or with ``plane``
    an :class:`Activation` of the bf16 rows alone (one conversion of SDPA's output, which lies
    token-major already). A prompt from an empty cache runs as ``Hkv`` sequences of ``H / Hkv``
    query heads that all read one K/V head (a stride-0 head axis: no copy of K/V); after cached
    rows (a bottom-right causal mask) K/V heads are repeated to H, which costs a copy of this
    layer's K/V.
    """
    t, h, d = q.shape
    hkv = k.shape[1]
    rep = h // hkv
    q = q.to(k.dtype)
    if start == 0:
        qg = q.view(t, hkv, rep, d).permute(1, 2, 0, 3)
        kg = k.permute(1, 0, 2)[:, None].expand(hkv, rep, k.shape[0], d)
        vg = v.permute(1, 0, 2)[:, None].expand(hkv, rep, v.shape[0], d)
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).permute(2, 0, 1, 3)
    else:  # new rows see every cached position and the new ones up to themselves: causal, aligned
        # to the bottom right, which the fused kernels apply themselves (no mask tensor)
        qh = q.transpose(0, 1)[None]
        kh = k.transpose(0, 1).repeat_interleave(rep, 0)[None]
        vh = v.transpose(0, 1).repeat_interleave(rep, 0)[None]
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(t, start + t))[0].transpose(0, 1)
    o = o.reshape(t, h * d)
    return Activation(None, o.to(torch.bfloat16)) if plane else o.float()


def attention_candidates(phase: str, ctx) -> list[Candidate]:
    """Decode: the split-KV kernel. Paged decode (the batched engine): the paged split-KV kernel
    (:mod:`.paged_attention`); paged prefill, its prompt rows: :mod:`.paged_prefill`. Prefill (GPU
    only): torch's flash SDPA in f16."""
    if phase == "decode":
        from ..decode import mma_enabled  # the GEMVs that read the output's int8 form

        return [Candidate(PLUGIN, LABEL, SplitKVAttention(pdl=pdl_enabled(ctx), form=mma_enabled(ctx)),
                          fuses=("rope_kv",))]
    if phase == "paged_decode":
        from .paged_attention import paged_candidate

        return [paged_candidate(pdl_enabled(ctx))]
    if phase == "paged_prefill":
        from .paged_prefill import paged_prefill_candidate

        return [paged_prefill_candidate()]
    if ctx.device.type == "cuda":
        return [Candidate(PLUGIN, "mmq.attn.flash", prefill_flash, fuses=("plane",))]
    return []
