"""How fast a decode-sized matrix can be read at all on this GPU (the ceiling for the GEMVs).

    python benchmarks/read_roofline.py

For each size (the 7B's qkv, q4_K ffn_down, gate|up, output head), in CUDA-graph chains over
rotating copies as ``sweep.py`` times the GEMVs: ``torch.sum`` of the bytes as int32, and a
Triton kernel that sums rows the way the GEMVs read them (``BN`` rows a program, ``SPAN`` bytes of
each row a step), with and without a contiguous layout (each program streams one contiguous run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import graph_time  # noqa: E402

SIZES = [(4608, 1792, "qkv"), (3584, 9472, "q4_K down"), (37888, 1792, "gate|up"), (152064, 2940, "output q6_K")]
ROTATE = 256 << 20


@triton.jit
def _rows_kernel(w_ptr, y_ptr, N, RW, BN: tl.constexpr, SW: tl.constexpr):
    """Program p: rows p*BN .. of RW int32 words each, SW words of each row per step (GEMV order)."""
    r = tl.program_id(0) * BN + tl.arange(0, BN)
    r = tl.minimum(r, N - 1).to(tl.int64)
    acc = tl.zeros([BN, SW], dtype=tl.int32)
    for k in range(0, RW, SW):
        c = k + tl.arange(0, SW)
        acc += tl.load(w_ptr + r[:, None] * RW + c[None, :], mask=c[None, :] < RW, other=0)
    tl.store(y_ptr + tl.program_id(0) * BN + tl.arange(0, BN), tl.sum(acc, axis=1))


@triton.jit
def _flat_kernel(w_ptr, y_ptr, total, per, B: tl.constexpr):
    """Program p: words p*per .. p*per + per - 1, B a step (a contiguous stream)."""
    base = tl.program_id(0).to(tl.int64) * per
    acc = tl.zeros([B], dtype=tl.int32)
    for k in range(0, per, B):
        o = base + k + tl.arange(0, B)
        acc += tl.load(w_ptr + o, mask=o < total, other=0)
    tl.store(y_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def main() -> None:
    for n, row_bytes, label in SIZES:
        nbytes = n * row_bytes
        copies = max(2, min(16, -(-ROTATE // nbytes)))
        ws = [torch.randint(-2**31, 2**31 - 1, (n, row_bytes // 4), dtype=torch.int32, device="cuda")
              for _ in range(copies)]
        y = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
        reps = max(1, 8 // copies)
        rows = [(graph_time([lambda w=w: w.sum(dtype=torch.int32) for w in ws] * reps), "torch.sum")]
        rw = row_bytes // 4
        for bn, sw, warps in [(64, 32, 4), (64, 64, 4), (32, 64, 4), (16, 128, 4), (128, 32, 8)]:
            grid = (triton.cdiv(n, bn),)
            rows.append((graph_time([lambda w=w: _rows_kernel[grid](w, y, n, rw, BN=bn, SW=sw, num_warps=warps)
                                      for w in ws] * reps), f"rows BN={bn} step {sw * 4} B warps={warps}"))
        total = n * rw
        for progs, b, warps in [(528, 2048, 4), (1056, 2048, 4), (2112, 1024, 4), (264, 4096, 8)]:
            per = triton.cdiv(triton.cdiv(total, progs), b) * b
            grid = (triton.cdiv(total, per),)
            rows.append((graph_time([lambda w=w: _flat_kernel[grid](w, y, total, per, B=b, num_warps=warps)
                                      for w in ws] * reps), f"flat {grid[0]} programs step {b * 4} B warps={warps}"))
        print(f"\n## {label}: {nbytes / 2**20:.1f} MiB ({copies} copies)")
        for t, lab in sorted(rows):
            print(f"  {t * 1e6:8.2f} us  {nbytes / t / 1e9:6.0f} GB/s  {lab}", flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
