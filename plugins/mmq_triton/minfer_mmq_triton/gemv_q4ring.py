"""The q4_K int8 decode GEMV (``gemv_q4plane``'s math) with its weights streamed through a ring
of shared-memory buffers by asynchronous copies (``cp.async``, compute capability 8.0+), written
in Gluon because Triton's own pipeliner stages only loads that feed a tensor-core dot.

Why: the large int8 GEMVs of the 7B (gate|up, ffn_down) ran at 1.8-2.2 TB/s of the H200's
4.3 with plain loads: a thread's loads sit in its registers until used, so the bytes a multiprocessor
has in flight are bounded by registers (~24 KB), too few to cover HBM latency. Here a program
keeps ``STAGES - 1`` steps of weights in flight in shared memory while it computes on one, and it
requests the first steps before its programmatic-dependent-launch wait (weights are never written
by an earlier kernel; shared memory is private to the program), so they arrive while the previous
kernel still runs.

Layout per step (plane layout: ``gemv_q4plane``): ``BN`` rows x ``S`` spans x 64 bytes of quant
words, plus per row and span the two ``sc`` words and the ``d | dmin`` word. A thread computes
``R`` rows of one half (``j``) of one span: 8 words, i.e. 32 low-nibble values (sub-block
``4t + j``) and 32 high-nibble values (``4t + 2 + j``), whole sub-blocks, so no lane exchanges
its partial sums before scaling; the R rows share the thread's x words.

Same arithmetic as ``_gemv_q4p_i8_kernel`` (two int8 digits of x, integer sub-block sums scaled in
float32); only the float summation order differs. Not available under ``TRITON_INTERPRET``
(Gluon has no interpreter): ``decode`` chooses it on CUDA only, and the GPU tests compare it with
the dequantized weights.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from .gemv_q8dot import quantize_x
from .gemv_split import SplitScratch, bias_or_residual, whole_steps
from .planes import Q4KPlane


@gluon.jit
def _dp4a(a, b):
    """Per 32-bit word: sum of its 4 unsigned bytes of ``a`` times the signed bytes of ``b``."""
    return gl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, 0;", "=r,r,r", [a, b],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _pdl_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _issue(ring_q, ring_a, ring_b, ring_d, slot, step, n_steps, lo, hi, q_ptrs, q_t, sc_ptrs, dm_ptrs, s_t,
           S: gl.constexpr):
    """Start the copies of step ``step`` (spans ``lo + step * S ...``) into ring slot ``slot``;
    nothing past ``n_steps`` or ``hi`` is read (the copies then write zeros).

    ``q_ptrs`` [BN, S, 2, 8]: the quant words of spans ``0 .. S - 1`` (``q_t``: their span);
    ``sc_ptrs`` / ``dm_ptrs`` [BN, 1]: each row's first ``sc`` / ``dm`` word; ``s_t`` [1, S]."""
    t0 = lo + step * S
    ok = step < n_steps
    cp.async_copy_global_to_shared(ring_q.index(slot), q_ptrs + t0 * 16, mask=((t0 + q_t) < hi) & ok)
    t = t0 + s_t
    m = (t < hi) & ok
    cp.async_copy_global_to_shared(ring_a.index(slot), sc_ptrs + t * 2, mask=m)
    cp.async_copy_global_to_shared(ring_b.index(slot), sc_ptrs + t * 2 + 1, mask=m)
    cp.async_copy_global_to_shared(ring_d.index(slot), dm_ptrs + t // 2, mask=m)


@gluon.jit
def _gemv_q4p_i8_ring_kernel(
    xh_ptr, xl_ptr, xs_ptr, x16_ptr, qw_ptr, sc_ptr, dm_ptr, bias_ptr, y_ptr, part_ptr, cnt_ptr,
    N, NT, stride_ym, stride_bm, n_blocks,
    HAS_BIAS: gl.constexpr, EVEN: gl.constexpr, BN: gl.constexpr, S: gl.constexpr, R: gl.constexpr, SPLIT: gl.constexpr,
    STAGES: gl.constexpr, PDL: gl.constexpr,
):
    """Grid (cdiv(N, BN), SPLIT, M); ``BN = R * (16 // S) * num_warps`` (a warp: 32 // (2 S) row
    groups x S spans x 2 halves)."""
    NW: gl.constexpr = gl.num_warps()
    TR: gl.constexpr = 16 // S
    L: gl.constexpr = gl.BlockedLayout([R, 1, 1, 8], [TR, S, 2, 1], [NW, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L)  # [BN, S, 2]
    L2: gl.constexpr = gl.SliceLayout(2, L3)  # [BN, S]
    LR: gl.constexpr = gl.SliceLayout(1, L2)  # [BN]
    X3: gl.constexpr = gl.SliceLayout(0, L)  # [S, 2, 8]
    X2: gl.constexpr = gl.SliceLayout(2, X3)  # [S, 2] (to build [S, 2, 8])
    XS: gl.constexpr = gl.SliceLayout(0, L3)  # [S, 2] (to combine with [BN, S, 2])
    SH4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
    SH2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    gl.static_assert(BN == R * TR * NW)

    pid = gl.program_id(0)
    s_id = gl.program_id(1)
    xm = gl.program_id(2)
    rows = pid * BN + gl.arange(0, BN, layout=LR)
    r = gl.minimum(rows, N - 1).to(gl.int64)

    # index tensors of a step: quant words [BN, S, 2, 8], scale words [BN, S], x words [S, 2, 8]
    t_s = gl.arange(0, S, layout=gl.SliceLayout(0, L2))
    t_b = gl.arange(0, S, layout=gl.SliceLayout(1, XS))
    j_b = gl.arange(0, 2, layout=gl.SliceLayout(0, XS))
    j_x = gl.arange(0, 2, layout=gl.SliceLayout(0, X2))
    t_x = gl.arange(0, S, layout=gl.SliceLayout(1, X2))
    w_x = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, X3)))
    xo = (gl.expand_dims(gl.expand_dims(t_x * 32, 1) + gl.expand_dims(j_x * 8, 0), 2)
          + gl.expand_dims(gl.expand_dims(w_x, 0), 0))  # [S, 2, 8] x word of span t's low half
    xt = gl.expand_dims(gl.expand_dims(t_x, 1) + gl.expand_dims(j_x * 0, 0), 2) + gl.expand_dims(
        gl.expand_dims(w_x * 0, 0), 0)  # [S, 2, 8] its span
    q_col = gl.expand_dims(xo - gl.expand_dims(gl.expand_dims(t_x * 16, 1), 2), 0)  # t*16 + j*8 + w
    r4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(r * (NT * 16), 1), 2), 3)
    q_ptrs = qw_ptr + r4 + q_col
    q_t = gl.expand_dims(xt, 0)
    sc_ptrs = sc_ptr + gl.expand_dims(r * (NT * 2), 1)  # [BN, 1]: word 2t holds sub-blocks 4t, 4t+1
    dm_ptrs = dm_ptr + gl.expand_dims(r * (NT // 2), 1)  # word t // 2: d | dmin of span t's block
    s_t = gl.expand_dims(t_s, 0)  # [1, S]

    ring_q = gl.allocate_shared_memory(gl.int32, [STAGES, BN, S, 2, 8], SH4)
    ring_a = gl.allocate_shared_memory(gl.int32, [STAGES, BN, S], SH2)
    ring_b = gl.allocate_shared_memory(gl.int32, [STAGES, BN, S], SH2)
    ring_d = gl.allocate_shared_memory(gl.int32, [STAGES, BN, S], SH2)

    per = gl.cdiv(gl.cdiv(NT, SPLIT), S) * S
    lo = s_id * per
    hi = gl.minimum(lo + per, NT)
    n_steps = gl.cdiv(hi - lo, S)
    for i in gl.static_range(STAGES - 1):  # weights only: safe before the PDL wait
        _issue(ring_q, ring_a, ring_b, ring_d, i, i, n_steps, lo, hi, q_ptrs, q_t, sc_ptrs, dm_ptrs, s_t, S)
        cp.commit_group()
    if PDL:
        _pdl_wait()

    KW = NT * 32
    xh_row = xh_ptr + xm * KW
    xl_row = xl_ptr + xm * KW
    jj = gl.expand_dims(gl.expand_dims(j_b, 0), 0)  # [1, 1, 2]
    acc = gl.zeros([BN, S, 2], gl.float32, layout=L3)
    for k in range(n_steps):
        cp.wait_group(STAGES - 2)
        gl.thread_barrier()  # every thread's copies of step k landed; slot k - 1 is free again
        _issue(ring_q, ring_a, ring_b, ring_d, (k + STAGES - 1) % STAGES, k + STAGES - 1, n_steps, lo, hi,
               q_ptrs, q_t, sc_ptrs, dm_ptrs, s_t, S)
        cp.commit_group()
        slot = k % STAGES
        t0 = lo + k * S
        tt = t0 + t_b
        sb = xm * (NT * 4) + gl.expand_dims(tt * 4, 1) + gl.expand_dims(j_b, 0)  # [S, 2] x block, low half
        if EVEN:  # every step whole: no masks
            xh_lo = gl.load(xh_row + t0 * 32 + xo)
            xh_hi = gl.load(xh_row + t0 * 32 + xo + 16)
            xl_lo = gl.load(xl_row + t0 * 32 + xo)
            xl_hi = gl.load(xl_row + t0 * 32 + xo + 16)
            xs_lo = gl.load(xs_ptr + sb)
            xs_hi = gl.load(xs_ptr + sb + 2)
            xa_lo = gl.load(x16_ptr + 2 * sb) + gl.load(x16_ptr + 2 * sb + 1)
            xa_hi = gl.load(x16_ptr + 2 * sb + 4) + gl.load(x16_ptr + 2 * sb + 5)
        else:
            xmask = (t0 + xt) < hi
            xh_lo = gl.load(xh_row + t0 * 32 + xo, mask=xmask, other=0)
            xh_hi = gl.load(xh_row + t0 * 32 + xo + 16, mask=xmask, other=0)
            xl_lo = gl.load(xl_row + t0 * 32 + xo, mask=xmask, other=0)
            xl_hi = gl.load(xl_row + t0 * 32 + xo + 16, mask=xmask, other=0)
            m2 = gl.expand_dims(tt < hi, 1)
            xs_lo = gl.load(xs_ptr + sb, mask=m2, other=0.0)
            xs_hi = gl.load(xs_ptr + sb + 2, mask=m2, other=0.0)
            xa_lo = gl.load(x16_ptr + 2 * sb, mask=m2, other=0.0) + gl.load(x16_ptr + 2 * sb + 1, mask=m2, other=0.0)
            xa_hi = gl.load(x16_ptr + 2 * sb + 4, mask=m2, other=0.0) + gl.load(x16_ptr + 2 * sb + 5, mask=m2,
                                                                                 other=0.0)

        q = ring_q.index(slot).load(L)
        qlo = q & 0x0F0F0F0F
        qhi = (q >> 4) & 0x0F0F0F0F
        ih_lo = gl.sum(_dp4a(qlo, gl.expand_dims(xh_lo, 0)), axis=3).to(gl.float32)  # [BN, S, 2]
        il_lo = gl.sum(_dp4a(qlo, gl.expand_dims(xl_lo, 0)), axis=3).to(gl.float32)
        ih_hi = gl.sum(_dp4a(qhi, gl.expand_dims(xh_hi, 0)), axis=3).to(gl.float32)
        il_hi = gl.sum(_dp4a(qhi, gl.expand_dims(xl_hi, 0)), axis=3).to(gl.float32)

        w_lo = gl.expand_dims(ring_a.index(slot).load(L2), 2)  # [BN, S, 1]
        w_hi = gl.expand_dims(ring_b.index(slot).load(L2), 2)
        wd = gl.expand_dims(ring_d.index(slot).load(L2), 2)
        d = (wd & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        dmin = ((wd >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        sh = jj * 16
        a_lo = d * ((w_lo >> sh) & 0xFF).to(gl.float32)
        c_lo = dmin * ((w_lo >> (sh + 8)) & 0xFF).to(gl.float32)
        a_hi = d * ((w_hi >> sh) & 0xFF).to(gl.float32)
        c_hi = dmin * ((w_hi >> (sh + 8)) & 0xFF).to(gl.float32)
        acc += a_lo * ((ih_lo + il_lo * (1.0 / 256.0)) * gl.expand_dims(xs_lo, 0)) - c_lo * gl.expand_dims(xa_lo, 0)
        acc += a_hi * ((ih_hi + il_hi * (1.0 / 256.0)) * gl.expand_dims(xs_hi, 0)) - c_hi * gl.expand_dims(xa_hi, 0)
    cp.wait_group(0)

    y = gl.sum(gl.sum(acc, axis=2), axis=1)  # [BN] in LR
    rmask = rows < N
    if SPLIT == 1:
        if HAS_BIAS:
            y += gl.load(bias_ptr + xm * stride_bm + rows, mask=rmask, other=0.0)
        gl.store(y_ptr + xm * stride_ym + rows, y, mask=rmask)
    else:  # as gemv_split.store_rows: the last program to arrive sums the partials in split order
        part = part_ptr + xm * (SPLIT * N)
        gl.store(part + s_id * N + rows, y, mask=rmask)
        gl.thread_barrier()
        cnt = cnt_ptr + xm * n_blocks + pid
        arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tot = gl.load(part + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            for u in gl.static_range(1, SPLIT):
                tot += gl.load(part + u * N + rows, mask=rmask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += gl.load(bias_ptr + xm * stride_bm + rows, mask=rmask, other=0.0)
            gl.store(y_ptr + xm * stride_ym + rows, tot, mask=rmask)
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


def ring_rows(spans: int, rows_per_thread: int, num_warps: int) -> int:
    """BN of a ring config: rows a program covers."""
    return rows_per_thread * (16 // spans) * num_warps


def gemv_q4p_ring(x: torch.Tensor, plane: Q4KPlane, bias, spans: int, rows_per_thread: int, num_warps: int,
                  stages: int, split: int, scratch: SplitScratch, residual=None, norm=None, swiglu: bool = False,
                  pdl: bool = False) -> torch.Tensor:
    """``x`` float32 ``(M, K)`` -> float32 ``(M, N)`` (same contract as ``gemv_q4plane.gemv_q4p`` with
    ``int8=True``); ``scratch`` built for ``BN = ring_rows(spans, rows_per_thread, num_warps)``."""
    n, half_k = plane.qs.shape
    nt = half_k // 64
    m = x.shape[0]
    bn = ring_rows(spans, rows_per_thread, num_warps)
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    part, cnt = scratch.get(m, x.device)
    b, sbm, has_bias = bias_or_residual(bias, residual, y)
    xh, xl, xs, x16 = quantize_x(x, norm, swiglu, pdl)
    dm32 = plane.dm.view(torch.int32)
    sc32 = plane.sc.view(plane.sc.shape[0], -1).view(torch.int32)
    extra = {"launch_pdl": True} if pdl else {}
    _gemv_q4p_i8_ring_kernel[(scratch.n_blocks, split, m)](
        xh, xl, xs, x16, plane.qs.view(torch.int32), sc32, dm32, b, y, part, cnt,
        n, nt, y.stride(0), sbm, scratch.n_blocks,
        HAS_BIAS=has_bias, EVEN=whole_steps(nt, spans, split), BN=bn, S=spans, R=rows_per_thread, SPLIT=split, STAGES=stages, PDL=pdl,
        num_warps=num_warps, **extra)
    return y
