"""Registration-time planes: GGUF q4_K / q6_K blocks repacked for 16-byte loads.

Built once per weight at load time (plain torch ops on the weight's device, in row chunks) and
stored in ``weight.planes`` under the keys below. The prefill GEMMs (``gemm_planes``) read them,
and the decode GEMVs read the q4_K plane too (``gemv_q4plane``): with both reading it, the raw
q4_K blocks are no longer needed and the core releases them. All planes are row-major per output row
``n``, so fused weights (QKV, gate|up) stay concatenations of rows. ``K`` is a multiple of 256.

Nibble plane (shared by both types): uint8 ``(N, K // 2)``. For every 128-value span starting at
``k0`` (``k0 % 128 == 0``), byte ``k0 // 2 + i`` (``i < 64``) holds value ``k0 + i`` in its low
nibble and value ``k0 + 64 + i`` in its high nibble. A 64-byte load thus yields two contiguous
64-value runs. (This is exactly q6_K's own ``ql`` order; q4_K's 32-value pairing is repacked.)

``KEY_Q4K`` -> :class:`Q4KPlane` (``MINFER_MMQ_Q4K_DSC``: "decoded scales"), 4.625 bits per
value (raw q4_K: 4.5), exact (every field is the GGUF's own, unpacked):
    ``qs``  nibble plane, ``q`` in 0..15
    ``sc``  uint8 ``(N, K // 32, 2)``: the 6-bit scale ``sc`` and min ``m`` of each 32-value
            sub-block (q4_K's packed 12 bytes decoded)
    ``dm``  float16 ``(N, K // 256, 2)``: the block's ``d`` and ``dmin``;
            ``w = (d * sc) * q - (dmin * m)``.

``KEY_Q6K`` -> :class:`Q6KPlane` (``MINFER_MMQ_Q6K_EXP``: "expanded"), 7 bits per value:
    ``ql``  nibble plane, low 4 bits of the 6-bit ``q``
    ``qh``  uint8 ``(N, K // 4)``: for every 256-value span at ``k0``, byte ``k0 // 4 + i``
            (``i < 64``) holds the high 2 bits of value ``k0 + 64 * f + i`` at bits ``2f, 2f+1``
            (``f = 0..3``)
    ``sc``  float16 ``(N, K // 16)``: ``d * scale`` of each 16-value sub-block;
            ``w = sc * ((ql | qh << 4) - 32)``.

The q6_K builder returns ``None`` when a scale ``d * scale`` does not fit float16 (never seen in
real files); the GEMM family then reads that weight's raw blocks instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QT

KEY_Q4K = "mmq_triton.q4k"
KEY_Q6K = "mmq_triton.q6k"
KEY_W16 = "mmq_triton.w16"  # MINFER_MMQ_RAW=0: a bf16 (N, K) copy, no blocks read at run time

CHUNK_ROWS = 2048  # rows per build step: bounds the temporaries (~30 bytes per value)


@dataclass
class Q4KPlane:
    qs: torch.Tensor  # uint8 (N, K // 2), nibble plane
    sc: torch.Tensor  # uint8 (N, K // 32, 2): 6-bit scale, 6-bit min
    dm: torch.Tensor  # float16 (N, K // 256, 2): d, dmin

    def nbytes(self) -> int:
        return self.qs.numel() + self.sc.numel() + self.dm.numel() * 2

    def words(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``qs``, ``sc`` and ``dm`` as int32 words, as the decode GEMVs read them: ``(N, K / 8)``,
        ``(N, K / 64)`` (two sub-blocks' scale and min a word), ``(N, K / 256)`` (``d | dmin``)."""
        return (self.qs.view(torch.int32), self.sc.view(self.sc.shape[0], -1).view(torch.int32),
                self.dm.view(torch.int32))


@dataclass
class Q6KPlane:
    ql: torch.Tensor  # uint8 (N, K // 2), nibble plane
    qh: torch.Tensor  # uint8 (N, K // 4), 2-bit fields
    sc: torch.Tensor  # float16 (N, K // 16)

    def nbytes(self) -> int:
        return self.ql.numel() + self.qh.numel() + self.sc.numel() * 2


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 at byte ``at`` of each block ``(..., type_size)``, as float32 ``(..., 1)``."""
    return b[..., at:at + 2].contiguous().view(torch.float16).float()


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_K's 12 packed bytes ``(..., 12)`` -> eight 6-bit scales and mins, uint8 ``(..., 8)``."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return sc, mn


def _pack_nibbles(vals: torch.Tensor) -> torch.Tensor:
    """uint8 values ``(R, K)`` < 16 in natural order -> the nibble plane ``(R, K // 2)``."""
    v = vals.reshape(vals.shape[0], -1, 2, 64)
    return (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(vals.shape[0], -1)


def _to_f16(x: torch.Tensor) -> torch.Tensor | None:
    y = x.to(torch.float16)
    return y if bool(torch.isfinite(y).all()) else None


def build_q4k(raw: torch.Tensor, k: int) -> Q4KPlane:
    """q4_K blocks ``(N, K // 256 * 144)`` uint8 -> :class:`Q4KPlane` on the same device."""
    n, nb = raw.shape[0], k // 256
    qs = torch.empty(n, k // 2, dtype=torch.uint8, device=raw.device)
    scm = torch.empty(n, k // 32, 2, dtype=torch.uint8, device=raw.device)
    dm = torch.empty(n, nb, 2, dtype=torch.float16, device=raw.device)
    for r0 in range(0, n, CHUNK_ROWS):
        b = raw[r0:r0 + CHUNK_ROWS].reshape(-1, nb, 144)
        rows = b.shape[0]
        sc, mn = _k4_scales(b[..., 4:16])
        scm[r0:r0 + rows] = torch.stack([sc, mn], dim=-1).reshape(rows, k // 32, 2)
        dm[r0:r0 + rows] = b[..., 0:4].contiguous().view(torch.float16).reshape(rows, nb, 2)
        q = b[..., 16:144].reshape(rows, nb, 4, 1, 32)  # 32-byte groups: low nibble first 32 values
        shift = torch.tensor([0, 4], dtype=torch.uint8, device=raw.device).view(1, 1, 1, 2, 1)
        vals = ((q >> shift) & 0xF).reshape(rows, k)
        qs[r0:r0 + rows] = _pack_nibbles(vals)
    return Q4KPlane(qs, scm, dm)


def build_q6k(raw: torch.Tensor, k: int) -> Q6KPlane | None:
    """q6_K blocks ``(N, K // 256 * 210)`` uint8 -> :class:`Q6KPlane` on the same device."""
    n, nb = raw.shape[0], k // 256
    ql = torch.empty(n, k // 2, dtype=torch.uint8, device=raw.device)
    qh = torch.empty(n, k // 4, dtype=torch.uint8, device=raw.device)
    sc = torch.empty(n, k // 16, dtype=torch.float16, device=raw.device)
    sh2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=raw.device)
    for r0 in range(0, n, CHUNK_ROWS):
        b = raw[r0:r0 + CHUNK_ROWS].reshape(-1, nb, 210)
        rows = b.shape[0]
        s = _to_f16(_f16(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float())
        if s is None:
            return None
        sc[r0:r0 + rows] = s.reshape(rows, k // 16)
        ql[r0:r0 + rows] = b[..., 0:128].reshape(rows, k // 2)  # already the nibble plane order
        # raw qh: byte 32h + l holds value 128h + 32j + l at bits 2j (h: 128-half, j: 0..3)
        hb = (b[..., 128:192].reshape(rows, nb, 2, 1, 32) >> sh2.view(1, 1, 1, 4, 1)) & 3
        hb = hb.reshape(rows, nb, 4, 64)  # natural order, split as (f, i): value 64f + i
        packed = hb[:, :, 0] | (hb[:, :, 1] << 2) | (hb[:, :, 2] << 4) | (hb[:, :, 3] << 6)
        qh[r0:r0 + rows] = packed.reshape(rows, k // 4)
    return Q6KPlane(ql, qh, sc)


def build_w16(raw: torch.Tensor, qtype, k: int) -> torch.Tensor:
    """Any supported block type -> a bfloat16 ``(N, K)`` copy (the ``MINFER_MMQ_RAW=0`` path)."""
    from minfer_core.dequant import dequantize

    out = torch.empty(raw.shape[0], k, dtype=torch.bfloat16, device=raw.device)
    for r0 in range(0, raw.shape[0], CHUNK_ROWS):
        out[r0:r0 + CHUNK_ROWS] = dequantize(raw[r0:r0 + CHUNK_ROWS], qtype, k)
    return out


BUILDERS = {QT.Q4_K: (KEY_Q4K, build_q4k), QT.Q6_K: (KEY_Q6K, build_q6k)}
