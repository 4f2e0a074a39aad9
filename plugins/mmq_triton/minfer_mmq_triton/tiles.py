"""Tuned launch configurations, as data: decode GEMV tiles keyed by quant type and role, the rules
that pick among them from the weight's shape, and the split-K policy. Chosen by sweeps on an H200
at the 7B / 0.5B shapes (``benchmarks/sweep.py``); other GPUs run them unchanged.

A GEMV tile is ``(BN, BB, num_warps, MODE)``: ``BN`` output rows per program, ``BB`` blocks per
step (q4_K: 128-value spans, whose plane it reads), MODE 0 float kernels summing per sub-block,
1 float kernels dequantizing with one FMA, 2 int8 dot products (q4_K / q6_K; one small extra
launch quantizes x), 3 the same on tensor cores (q4_K / q6_K, CUDA only).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as QT

from .families import INT8, KQUANTS

#: (type, role) -> GEMV tile. Roles: ``float`` / ``int8`` the default of each path; ``narrow``: fewer
#: than ``NARROW_ROWS`` rows (masked 8-span steps, split at least ``NARROW_SPLIT`` ways); ``long``:
#: rows of ``LONG_K`` values or more; ``small``: under ``INT8_MIN_BYTES``. Legacy types:
#: ``small`` under 2 MiB, ``mid`` under 64 MiB, ``big`` above.
GEMV_TILES: dict[tuple[QT | str, str], tuple[int, int, int, int]] = {
    (QT.Q4_K, "float"): (8, 4, 4, 0),
    (QT.Q4_K, "narrow"): (8, 8, 4, 0),
    (QT.Q4_K, "int8"): (8, 4, 4, 2),
    (QT.Q4_K, "long"): (16, 2, 2, 2),
    (QT.Q4_K, "small"): (8, 16, 4, 2),
    (QT.Q5_K, "float"): (8, 2, 4, 0),  # num_warps 2 when a step is a single super-block (BB = 1)
    (QT.Q6_K, "float"): (8, 2, 4, 0),  # likewise
    (QT.Q6_K, "int8"): (16, 2, 2, 2),
    ("legacy", "small"): (8, 4, 2, 0),
    ("legacy", "mid"): (16, 4, 4, 0),
    ("legacy", "big"): (32, 4, 4, 0),
}
NARROW_ROWS, NARROW_SPLIT = 2048, 4
LONG_K = 8192
#: The int8 path serves weights of at least INT8_MIN_BYTES (below, its extra launch costs more than
#: the dot products save) and, at any size, the roles whose input is an RMSNorm output: there the
#: quantizing launch replaces the norm's own. On tensor cores (MODE 3) from INT8_MIN_BYTES_MMA: the
#: 7B's q and o (7.2 MB) took 7.6 us a call as float GEMVs and 5.4 + 1.3 (the quantizer) on MMA (H200,
#: ``step_timeline.py``), tg128 443.5 -> 453.7, at depth 4,096 416.9 -> 425.0 (one call, alternating).
INT8_MIN_BYTES, INT8_MIN_BYTES_MMA = 16 << 20, 4 << 20
INT8_NORM_ROLES: tuple[str, ...] = ("qkv", "qk", "gate_up", "output")
INT8_MAX_SPLIT = {QT.Q4_K: 8, QT.Q6_K: 4}
#: Legacy rows of up to LEGACY_ONE_STEP blocks (K <= 1024) under 64 MiB: one (masked) step covers the
#: whole row (4 or 8 rows a program), so no program waits for memory twice.
LEGACY_ONE_STEP = 32

#: MODE 3 (tensor cores), q4_K: MMA_WARPS warps a program, each one 16-row tile; matrices of MMA_TALL rows
#: or more (gate|up) take 2 spans a step with the next step requested before each step's arithmetic, the
#: others 4 spans; split-K until the grid has about MMA_PROGRAMS programs (at most MMA_MAX_SPLIT splits).
#: With the splits reduced in a cluster (``launch.cluster``) 16 splits still lose (7B tg128, H200, one
#: call: 493.3 -> 478.7 at the q6_K down, 468.9 at both downs).
MMA_WARPS, MMA_TALL, MMA_PROGRAMS, MMA_MAX_SPLIT = 4, 16384, 640, 8
#: q6_K's own: ``(16-row tiles a warp, blocks a step, num_warps, LOOKAHEAD)`` below MMA_TALL rows (the 7B's
#: down; split as q4_K) and from it (the output head, no split). Before the clusters, two tiles and two
#: blocks on 4 warps won below MMA_TALL (7B tg128, H200, one call: 453.7 against 446.8 at one tile, 443.4
#: at one tile and one block; 1,280 programs with 16 splits 425.7, 320 programs 442.5; one tile, one block,
#: 8 warps and the step ahead no faster). Under clusters one tile on 4 warps (two blocks) lost, 487.7
#: against 493.7, and one tile, one block, 8 warps and the step ahead (and the output head one block and
#: the step ahead, where it took two blocks) win: 493.97 / 493.97 -> 505.95 / 505.96 (the output head
#: alone 498.53 / 498.65; both trees alternating, one call); two blocks a step then 485.6 against 506.0.
#: Since the GEMVs let the next kernel launch only when their loop is done (``launch.pdl``), 4 warps (448
#: programs of 64 rows in place of 224 of 128) win a little: 540.43 / 540.45 -> 541.77 / 541.22, at depth
#: 4,096 498.32 / 500.03 -> 502.31 / 502.60 (one call, alternating), so the down and the output head now
#: take the same tiling.
MMA_Q6K = (1, 1, MMA_WARPS, 1)
#: The q6_K part of a q4_K + q6_K pair launch (``pair_mma``; a Q4_K_M layer's v beside q|k): ``(16-row tiles
#: a warp, blocks a step, LOOKAHEAD)`` on the q4_K part's warps and split. Compiled for sm_90 (triton 3.6)
#: the pair kernel at the 7B's shapes holds 84 registers a thread so (q|k's own kernel 72), 134 with the
#: step ahead and 140 at two blocks a step, which would leave its 504 programs more than one round.
PAIR_Q6K = (1, 1, 0)

#: Split-K (``launch.split``) for grids of fewer than SPLIT_BELOW programs, while the grid stays under
#: TARGET_PROGRAMS and each split keeps MIN_STEPS steps (MIN_STEPS_TINY under 2 MiB, where latency
#: dominates): short, wide matrices then fill the GPU.
SPLIT_BELOW, TARGET_PROGRAMS, MAX_SPLIT = 512, 4096, 64
MIN_STEPS, MIN_STEPS_TINY = 2.0, 1.5


#: Prefill, plane family: the fused GEMM serves at most FUSED_MAX_ROWS rows (with split-K it beat
#: expand + cuBLAS there at every 7B shape, 1.1-3.1x, ``bench_prefill.py --small``), and weights of
#: at least FUSED_WIDE_VALUES values up to FUSED_WIDE_ROWS rows (one 128-row tile, H200, 7B,
#: ``bench_batch_gemm.py --fused [--q6]``: q4_K gate|up 172 vs 204 us, down 95 vs 108 us; q6_K down
#: 132 vs 137, output head 742 vs 1,480; qkv and o lose); above, the planes are expanded to bf16
#: and cuBLAS multiplies.
FUSED_MAX_ROWS, FUSED_WIDE_ROWS, FUSED_WIDE_VALUES = 64, 128, 48 << 20
#: Fused GEMM tiles per row bucket (up to 64 rows only where the warpgroup-MMA GEMM is off: before
#: Hopper, or MINFER_DECODE_MMA=0): (rows up to, tile of weights under FUSED_TALL_ROWS rows, tile of
#: taller ones); a tile is ``(BLOCK_M, BLOCK_N, num_warps, num_stages, SWAP)``, SWAP: the weight tile
#: as the MMA's A operand and the rows as its N (``gemm_fused(swap=True)``, wgmma at 16 and 32 rows;
#: q4_K then decodes in float32 by default, see ``gemm_fused``). H200, 7B q4_K shapes, us a call, one
#: call (``bench_batch_gemm.py --rows 16,32 --fused 16,32,4,3 16,128,4,3 32,64,4,3 --fused-swap
#: --fused-decode``): at 16 rows (16, 128) swapped takes down in 41.5, qkv 18.3, o 11.7, gate|up 71.6
#: at (16, 32); at 32 rows gate|up takes 79.5 at (32, 64) swapped (69.6 in bf16x2, not the default:
#: see ``gemm_fused``), down 53.0, qkv 23.4 and o 14.2 at (32, 64) unswapped in bf16x2. From 64 rows
#: unswapped tiles are as fast or faster for q4_K (gate|up 81.7 vs 85.9 at 64, ~135 vs 143.8 at 128,
#: an earlier call).
FUSED_GEMM_TILES = ((16, (16, 128, 4, 3, True), (16, 32, 4, 3, False)),
                    (32, (32, 64, 4, 3, False), (32, 64, 4, 3, True)),
                    (64, (64, 64, 4, 3, False), (64, 64, 4, 3, False)),
                    (128, (128, 64, 4, 3, False), (128, 64, 4, 3, False)),
                    (None, (128, 128, 8, 3, False), (128, 128, 8, 3, False)))
FUSED_TALL_ROWS = 16384
#: q6_K's own tiles by bucket (us a call): at 16 rows (16, 64, 4, 3), down 61 vs 78 and the output
#: head 337 vs 380 with (16, 32, 4, 3), swapped no faster (65.3, 351.2); at 32 rows (32, 64)
#: swapped: down 63.9 and the output head 395.2 against 92.7 and 585.4 over one 64-row tile; at 64
#: rows (64, 64) swapped: down 93.6 vs 99.4, output head 586.5 vs 622.5; at 128 rows (128, 128, 8,
#: 3) swapped: down 121.8 vs 132.0, output head 652.0 vs 741.4 (and 890 at (128, 64, 4, 3)).
FUSED_GEMM_TILES_Q6K = {16: (16, 64, 4, 3, False), 32: (32, 64, 4, 3, True), 64: (64, 64, 4, 3, True),
                        128: (128, 128, 8, 3, True)}
#: The fused GEMM loads the next span's q4_K scales a step ahead from FUSED_AHEAD_ROWS-row tiles
#: (H200, 7B q4_K shapes, us a call, off -> on: gate|up 243.0 -> 126.3 at 32 rows, 102.6 -> 90.0 at
#: 64, 145.3 -> 132.1 at 128; qkv 63.2 -> 33.3 at 32; at 16 rows it loses, gate|up 73.2 -> 84.4).
#: q6_K's scales (or whole fields) loaded ahead lost at most shapes (output head at 128 rows 761 ->
#: 819 us, down at 64 rows 104.5 -> 120.7; won only at 32 rows: down 104.2 -> 93.8), so q6_K never does.
FUSED_AHEAD_ROWS = 32
#: On the GPU the fused GEMM decodes q4_K in bf16x2 arithmetic (``gemm_planes._q4k_values_bf16``)
#: rather than float32 from BF16_DECODE_ROWS-row unswapped tiles (H200, 7B shapes, us a call,
#: float32 -> bf16x2, ``bench_batch_gemm.py --decode``: gate|up 125.3 -> 118.1 at 32 rows, 91.3 ->
#: 83.8 at 64, qkv 25.0 -> 21.8 at 64, down 71.4 -> 66.5 at 128; at 16 rows it loses, gate|up 72.2
#: -> 81.4). The plane expansion keeps float32: bf16x2 is no faster there (memory bound, gate|up
#: 112.1 vs 112.3).
BF16_DECODE_ROWS = 32
#: Split-K of the fused GEMM (``fused_split``): narrow or K-long weights (qkv, o, down) give too
#: few output tiles to fill the GPU at few rows.
FUSED_PROGRAMS, FUSED_MIN_SPANS, FUSED_MAX_SPLIT = 264, 4, 16
#: Plane expansion kernels: (BLOCK_N, SPANS, num_warps); SPANS: 128-value spans per program (q4_K: of
#: nine tiles in one call, within 3% of the best at each 7B shape; gate|up 112.9 us, 112.3-131.3).
DEQUANT_TILES = {"q4_k": (32, 4, 4), "q6_k": (32, 1, 4)}

#: PDL (``launch.pdl``): GEMVs over weights of fewer than PREFETCH_MAX_VALUES values ask L2 for
#: PREFETCH_LINES 128-byte lines of each row before waiting for the previous kernel. It pays where
#: kernels are short and costs where grids run many waves (later waves re-request their lines).
PREFETCH_LINES, PREFETCH_MAX_VALUES = 8, 10_000_000


def use_fused(m: int, n: int, k: int) -> bool:
    """Whether the fused plane GEMM beats expand + cuBLAS for ``(M, K) @ (N, K).T`` (q4_K or q6_K)."""
    if m <= FUSED_MAX_ROWS:
        return True
    return m <= FUSED_WIDE_ROWS and n * k >= FUSED_WIDE_VALUES


def fused_split(n: int, spans: int, bn: int) -> int:
    """Split-K of the fused plane GEMM for a weight of ``n`` rows and ``spans`` K steps under
    ``BLOCK_N = bn``: from the weight's shape alone (never the row count), so that a row gets the
    same bits in a batch of any size. Doubles while the output tiles of one row block stay under
    FUSED_PROGRAMS and each split keeps FUSED_MIN_SPANS steps."""
    return doubling_split(-(-n // bn), spans, FUSED_PROGRAMS, FUSED_MIN_SPANS, FUSED_MAX_SPLIT)


def doubling_split(tiles_n: int, spans: int, programs: int, min_spans: int, max_split: int) -> int:
    """Split-K for ``tiles_n`` output tiles of ``spans`` K steps: doubles while the grid stays within
    ``programs``, each split keeps ``min_spans`` steps and the split stays under ``max_split``."""
    split = 1
    while split < max_split and tiles_n * split * 2 <= programs and spans // (split * 2) >= min_spans:
        split *= 2
    return split


def fused_ahead(block_m: int) -> bool:
    """Whether the fused plane GEMM at ``BLOCK_M = block_m`` loads a q4_K span's scales a step early."""
    return block_m >= FUSED_AHEAD_ROWS


def fused_bf16_decode(block_m: int) -> bool:
    """Whether the fused plane GEMM at ``BLOCK_M = block_m`` decodes q4_K in bf16x2 arithmetic (GPU)."""
    return block_m >= BF16_DECODE_ROWS


def fused_gemm_tile(m: int, qtype: QT, n: int = 0) -> tuple[int, int, int, int, bool]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages, SWAP)`` of the fused plane GEMM for ``m`` rows of
    an ``n``-row weight of ``qtype`` (the bucket's tile by the weight's height, or q6_K's own where
    it has one). From the row bucket and the weight alone, like the split."""
    top, low, tall = next(t for t in FUSED_GEMM_TILES if t[0] is None or m <= t[0])
    tile = tall if n >= FUSED_TALL_ROWS else low
    return FUSED_GEMM_TILES_Q6K.get(top, tile) if qtype == QT.Q6_K else tile


#: q4_K and q6_K matmuls of at most WGMMA_MAX_ROWS rows on Hopper run on the warpgroup-MMA GEMM
#: (``prefill.gemm_wgmma``: weights decoded into the MMA's A registers, the rows as its N). H200, 7B
#: shapes, us a call (``bench_batch_gemm.py --rows 8,16,32,64 --wgmma 1,2,4,8 [--q6]``; q4_K on the
#: kernel's bf16 draft): at 32 rows gate|up 54.5, down 34.1, qkv 11.6, o 10.5, q6_K down 40.6, the
#: output head 250.0, against 82.0, 53.0, 22.0, 15.0, 92.4 and 587.0 for one 64-row fused tile (79.5,
#: 53.0, 23.4, 14.2, 63.9, 395.2 for the fused 32-row tiles, an earlier call); at 128 rows it loses
#: (gate|up 144.5 against 132.6, down 75.1 against 67.6). Split-K doubles while the grid stays within
#: WGMMA_PROGRAMS programs of 64 weight rows and each split keeps WGMMA_MIN_SPANS spans, up to
#: WGMMA_MAX_SPLIT: o, qkv and down 8 (the fastest measured at each row count), gate|up 1 (within 6%
#: of the fastest), the output head 1 (timed at splits 4 and 8 only).
WGMMA_MAX_ROWS, WGMMA_PROGRAMS, WGMMA_MIN_SPANS, WGMMA_MAX_SPLIT = 64, 640, 2, 8


def wgmma_rows(m: int) -> int:
    """The warpgroup-MMA GEMM's N for ``m`` rows: a power of two from 8 (its activation tile)."""
    return max(8, 1 << (m - 1).bit_length())


def wgmma_split(n: int, k: int) -> int:
    """Split-K of the warpgroup-MMA GEMM over an ``n x k`` weight, from its shape alone."""
    return doubling_split(-(-n // 64), k // 128, WGMMA_PROGRAMS, WGMMA_MIN_SPANS, WGMMA_MAX_SPLIT)


#: q4_K matmuls of WGMMA_MAX_ROWS + 1 to ASYNC_MAX_ROWS rows over weights of at least FUSED_WIDE_VALUES
#: values run, on Hopper, on the asynchronous warpgroup-MMA GEMM (``prefill.gemm_wgmma_async``) at
#: ASYNC_TILE ``(NA, WG, STAGES)``, where they ran on the fused GEMM. H200, 7B shapes at 128 rows, us a
#: call (``bench_batch_gemm.py --rows 128 --only --async 128,1,2``): gate|up 106.2 (split 1), down 64.7
#: (split 4) against the fused GEMM's 139.1 and 67.0 and expand + cuBLAS's 191.0 and 101.6. At 512 rows
#: it loses to expand + cuBLAS (gate|up 362.0 against 299.1), and so it does for qkv and o at 128 (31.5
#: and 31.9 at split 1 against 24.1 and 19.4). Split-K doubles while the grid stays within
#: ASYNC_PROGRAMS programs and each split keeps ASYNC_MIN_SPANS spans, up to ASYNC_MAX_SPLIT.
#: q6_K weights of that size with more inputs than outputs (the 7B's down; not the output head, not
#: timed) run there too, at ASYNC_TILE_Q6K: H200, 96 / 128 rows (``bench_batch_gemm.py --q6 --only
#: --async ..``, split 4) 75.0 / 75.9 us against 77.9 / 79.6 at ASYNC_TILE and the fused GEMM's 114.6 /
#: 119.9 (expand + cuBLAS 114.0 / 114.6).
ASYNC_MAX_ROWS = 128
ASYNC_TILE, ASYNC_TILE_Q6K = (128, 1, 2), (128, 1, 3)
ASYNC_PROGRAMS, ASYNC_MIN_SPANS, ASYNC_MAX_SPLIT = 264, 8, 4


def _wide(qtype, n: int, k: int) -> bool:
    """The weights the asynchronous and warp-specialized GEMMs serve: q4_K of at least
    FUSED_WIDE_VALUES values, q6_K of that size with more inputs than outputs."""
    return n * k >= FUSED_WIDE_VALUES and (qtype == QT.Q4_K or (qtype == QT.Q6_K and k > n))


def async_route(qtype, m: int, n: int, k: int) -> bool:
    """Whether an ``m``-row matmul over this weight runs on the asynchronous warpgroup-MMA GEMM (Hopper)."""
    return WGMMA_MAX_ROWS < m <= ASYNC_MAX_ROWS and _wide(qtype, n, k)


def async_tile(qtype) -> tuple[int, int, int]:
    """The asynchronous GEMM's ``(NA, WG, STAGES)`` for a weight type."""
    return ASYNC_TILE_Q6K if qtype == QT.Q6_K else ASYNC_TILE


def async_split(m: int, n: int, k: int, tile: tuple[int, int, int] = ASYNC_TILE) -> int:
    """Split-K of the asynchronous warpgroup-MMA GEMM for ``(m, k) @ (n, k).T``."""
    na, wg, _ = tile
    programs = -(-n // (64 * wg)) * -(-m // na)
    return doubling_split(programs, k // 128, ASYNC_PROGRAMS, ASYNC_MIN_SPANS, ASYNC_MAX_SPLIT)


#: q4_K matmuls of ASYNC_MAX_ROWS + 1 to WS_MAX_ROWS rows (WS_MAX_ROWS_LONG_K for weights of more inputs
#: than outputs: the 7B's down) over weights of at least FUSED_WIDE_VALUES values run, on Hopper, on the
#: warp-specialized GEMM (``prefill.gemm_wgmma_ws``) at WS_TILE, where they expanded the weight for
#: cuBLAS. H100, 7B shapes, us a call against expand + cuBLAS (``.. --ws 256,1,5,8,96``): gate|up 168.0 /
#: 269.3 at 256 rows, 301.9 / 343.0 at 512, 642.5 / 518.4 at 1,024; down 98.7 / 137.6 at 256 (split 2),
#: 170.3 / 161.8 at 512. Split-K doubles while the tiles stay within WS_PROGRAMS and each split keeps
#: WS_MIN_SPANS spans, up to WS_MAX_SPLIT (down at 256 rows: 2, the fastest of 1, 2 and 4). The 7B's
#: q6_K down as well (H200, ``--q6 --only --ws ..``): 105.0 us at 256 rows (split 2) against 125.5 for
#: expand + cuBLAS, but 182.7 against 158.5 at 512.
#: q4_K weights of WS_SMALL_VALUES values up to FUSED_WIDE_VALUES (the 7B's qkv, o and the mixed layers'
#: qk) run there from WGMMA_MAX_ROWS + 1 to WS_MAX_ROWS rows where one round of tiles covers the call
#: (at most WS_PROGRAMS), at WS_SMALL_TILE up to ASYNC_MAX_ROWS rows. H200, one call (q measured alone,
#: before q and k became one weight), us a call with the model's residual (o) or bias (qkv, q) against
#: expand + cuBLAS: o 17.7 / 21.4 at 129 rows, 19.5 / 25.1 at 256, 30.7 / 36.7 at 512; q 19.3 / 26.1 at
#: 256, 27.4 / 37.1 at 512; qkv 25.9 / 30.9 at 129, 26.3 / 34.2 at 256, but 49.5 / 40.7 at 384 (144
#: tiles: two rounds).
WS_MAX_ROWS, WS_MAX_ROWS_LONG_K = 512, 256
WS_TILE, WS_SMALL_TILE = (256, 1, 5, 8, 96), (128, 1, 5, 8, 96)
WS_PROGRAMS, WS_MIN_SPANS, WS_MAX_SPLIT = 132, 8, 4
WS_SMALL_VALUES = 12 << 20


def ws_tile(m: int) -> tuple[int, int, int, int, int]:
    """The warp-specialized GEMM's tile for ``m`` rows."""
    return WS_SMALL_TILE if m <= ASYNC_MAX_ROWS else WS_TILE


def ws_route(qtype, m: int, n: int, k: int) -> bool:
    """Whether an ``m``-row matmul over this weight runs on the warp-specialized GEMM (Hopper)."""
    if _wide(qtype, n, k):
        return ASYNC_MAX_ROWS < m <= (WS_MAX_ROWS_LONG_K if k > n else WS_MAX_ROWS)
    one_round = -(-m // ws_tile(m)[0]) * -(-n // 64) <= WS_PROGRAMS
    return qtype == QT.Q4_K and n * k >= WS_SMALL_VALUES and WGMMA_MAX_ROWS < m <= WS_MAX_ROWS and one_round


def ws_split(m: int, n: int, k: int, tile: tuple[int, ...] = WS_TILE) -> int:
    """Split-K of the warp-specialized GEMM for ``(m, k) @ (n, k).T`` at ``tile`` (``(NA, WG, ..)``)."""
    na, wg = tile[:2]
    return doubling_split(-(-n // (64 * wg)) * -(-m // na), k // 128, WS_PROGRAMS, WS_MIN_SPANS, WS_MAX_SPLIT)


#: The batched step's q4_K weights of at most as many inputs as outputs (the 7B's qkv, o and gate|up)
#: run, on Hopper, on the warpgroup-MMA GEMM in groups of WGMMA_BATCH_ROWS rows (the MMA's N, fixed
#: whatever the step's row count, so a row's bits do not depend on it), split-K by ``wgmma_split``.
#: H200, 7B, ``minfer bench --batch 8 -p 128 -n 128``, one call: S_TG 2,033.0 / 2,031.6 against 1,971.0 /
#: 1,968.0 with every q4_K weight on the rows GEMM. Other weights stay on the rows GEMMs, faster for them
#: at 8 rows (us a call: q4_K down 30.5 vs 34.8 at split 8, q6_K down 37.8 vs 57.1 at split 4).
WGMMA_BATCH_ROWS = 8


def wgmma_batch(qtype, n: int, k: int) -> bool:
    """Whether the batched step multiplies this weight on the warpgroup-MMA GEMM (Hopper)."""
    return qtype == QT.Q4_K and k <= n


#: The batched step's tensor-core GEMM (``q4_k.gemm_mma``): (tiles a warp, 8-row groups a program,
#: num_warps); its split-K comes from the weight's shape, like the fused GEMM's.
ROWS_TILE = (2, 1, 4)
#: Blocks between a block's L2 prefetch and its loads in that GEMM when one program covers all the
#: rows (``bench_batch_gemm.py --ahead 0,1,2,4,8``, 7B shapes at 8 rows: gate|up 48.8 vs 50.2 us,
#: down 30.3 vs 33.5, o 13.3 vs 14.0; with more programs over the same weights it loses: at 32
#: rows gate|up 131.0 vs 120.5).
ROWS_AHEAD = 1


def rows_config(n: int, k: int, span: int = 128) -> tuple[int, int, int, int]:
    """``(tiles, groups, num_warps, split)`` of the batched step's GEMM for an ``n x k`` weight:
    nothing depends on the row count, so a row's bits never depend on the batch."""
    t, g, warps = ROWS_TILE
    return t, g, warps, fused_split(n, k // span, 16 * t * warps)


def pow2_divisor(nb: int, cap: int) -> int:
    """The largest power of two <= cap dividing nb, or cap when that is under cap / 4 (masked tail)."""
    bb = 1
    while bb * 2 <= cap and nb % (bb * 2) == 0:
        bb *= 2
    return bb if bb * 4 >= cap or nb < cap else cap


def auto_split(n: int, nb: int, bn: int, bb: int, nbytes: int = 0) -> int:
    """Splits of the row so that short, wide matrices still fill the GPU (see ``launch.split``)."""
    blocks, steps, split = -(-n // bn), -(-nb // bb), 1
    if blocks >= SPLIT_BELOW:
        return 1
    min_steps = MIN_STEPS_TINY if nbytes < (2 << 20) else MIN_STEPS
    while blocks * split * 2 <= TARGET_PROGRAMS and steps / (split * 2) >= min_steps:
        split *= 2
    return split


def mma_config(qt, n: int, k: int = 0) -> tuple[int, ...]:
    """MODE 3's ``(BN, BB, num_warps, 3, SPLIT, LOOKAHEAD)`` for a q4_K (BB: spans) or q6_K (BB:
    blocks) weight of ``n`` rows and ``k`` columns (``k`` given: only the splits that get a step, e.g.
    the 7B's o, qkv and q|k 7 of 8; H200, tg128 505.35 -> 509.74, one call, alternating)."""
    tall = n >= MMA_TALL
    if qt == QT.Q6_K:
        tiles, bb, warps, ahead = MMA_Q6K
    else:
        tiles, bb, warps, ahead = (1, 2, MMA_WARPS, 1) if tall else (1, 4, MMA_WARPS, 0)
    bn = 16 * tiles * warps
    split, blocks = 1, -(-n // bn)
    while not tall and split < MMA_MAX_SPLIT and blocks * split * 2 <= MMA_PROGRAMS:
        split *= 2
    if k:  # only the splits that get a step
        steps = -(-(k // (256 if qt == QT.Q6_K else 128)) // bb)
        split = -(-steps // -(-steps // split))
    return bn, bb, warps, 3, split, ahead


#: The q4_K tensor-core GEMV over MMA_TALL rows or more (gate|up) compiles under a cap of MMA_TALL_REGS
#: registers a thread. Left alone, ptxas gives it 78 and requests each step's quant words after the
#: previous step's MMAs (compiled for sm_90, triton 3.6), so one step is in flight, not the two that
#: LOOKAHEAD asks for; under 96 it requests them among those MMAs, and 96 still fits the 5 programs a
#: multiprocessor that keep its 592 resident at once. 7B, H200, alternating, one call each: tg128 539.16 /
#: 539.50 -> 542.37 / 542.77 (the cap alone), 545.12 / 544.68 -> 551.60 / 550.75 (beside the first step's
#: weights before the PDL wait, ``decode.make_gemv``); a cap of 128 on o, qkv, q|k and the pair as well
#: (every load ahead of the MMAs, 4 programs a multiprocessor) lost: 528.92 / 527.56; so did the q6_K down
#: under 160 at 7 splits (every load ahead, 3 programs a multiprocessor: 510.29 / 509.56 against 544.02 /
#: 544.51), and the output head under 168 tied (545.09 / 545.10).
MMA_TALL_REGS = 96


def mma_early(role: str) -> bool:
    """Whether the tensor-core GEMV of a weight in ``role`` loads its first step's weight words before the PDL
    wait (``q4_k.gemv_mma``'s EARLY): all but the output head, whose programs run in several rounds and
    where it tied (7B tg128 550.63 / 549.68 against 551.60 / 550.75, H200, one call, alternating)."""
    return role != "output"


def mma_max_regs(qt, n: int) -> int | None:
    """The register cap (``maxnreg``) of the tensor-core GEMV over an ``n``-row weight, None for none."""
    return MMA_TALL_REGS if QT(qt) == QT.Q4_K and n >= MMA_TALL else None


def q6k_evict_first(n: int) -> bool:
    """Whether the q6_K MMA GEMV over an ``n``-row weight loads its quant words ``L1::evict_first`` (the
    q4_K one always does): read once, they then leave L1 before x and the scale sectors that the next
    step reads again. H200, 7B shapes, us a call (graph-timed over rotating copies, one call, same
    bits): gate|up 26.30 -> 24.10, o 7.15 -> 6.83, q4_K down 16.84 -> 16.71, q6_K down 26.78 -> 25.86;
    but the q6_K output head (one tile a warp, MMA_TALL rows) 137.0 -> 163.8, so q6_K only below
    MMA_TALL rows."""
    return n < MMA_TALL


def gemm_glu_fits(n: int, rows: int, split: int) -> bool:
    """Whether a ``[gate | up]`` weight of ``n`` rows takes a GLU epilogue (``silu(g) * u`` written by the
    kernel) over tiles of ``rows`` weight rows, half gate and half up: no split-K, whole tiles of gate
    rows (the prefill warpgroup-MMA GEMMs' ``glu``)."""
    return split == 1 and n % 2 == 0 and (n // 2) % (rows // 2) == 0


def glu_fits(n: int, tiles: int, num_warps: int, split: int) -> bool:
    """Whether the q4_K MMA GEMV of a ``[gate | up]`` weight of ``n`` rows can also write ``silu(g) * u``
    (``q4_k.gemv_mma``'s GLU) under this tiling: :func:`gemm_glu_fits` over its programs' rows, each
    program's half of gate rows (and of up rows) whole 32-value blocks of it."""
    half = 8 * tiles * num_warps
    return half % 32 == 0 and gemm_glu_fits(n, 2 * half, split)


def _legacy_size(nbytes: int) -> str:
    return "small" if nbytes < (2 << 20) else "mid" if nbytes < (64 << 20) else "big"


def decode_config(qtype, n: int, k: int, role: str = "", mma: bool = False) -> tuple[int, ...]:
    """``(BN, BB, num_warps, MODE, SPLIT)`` for a weight of ``n`` rows and ``k`` columns; ``mma``: the
    tensor-core GEMV is available (its configs add LOOKAHEAD)."""
    from minfer_core.quants import info

    qt = QT(qtype)
    nbytes = n * info(qt).row_bytes(k)
    max_split = MAX_SPLIT
    if qt in KQUANTS:
        nb = k // (128 if qt == QT.Q4_K else 256)
        if qt in INT8 and (nbytes >= (INT8_MIN_BYTES_MMA if mma else INT8_MIN_BYTES) or role in INT8_NORM_ROLES):
            if mma:
                return mma_config(qt, n, k)
            tile = "int8"
            if qt == QT.Q4_K and k >= LONG_K:
                tile = "long"
            elif qt == QT.Q4_K and nbytes < INT8_MIN_BYTES:
                tile = "small"
            bn, cap, warps, mode = GEMV_TILES[qt, tile]
            max_split = INT8_MAX_SPLIT[qt]
        elif qt == QT.Q4_K:
            bn, cap, warps, mode = GEMV_TILES[qt, "float" if n >= NARROW_ROWS else "narrow"]
        else:
            bn, cap, warps, mode = GEMV_TILES[qt, "float"]
    else:
        nb = k // 32
        if nb <= LEGACY_ONE_STEP and nbytes < (64 << 20):  # the whole row in one (masked) step
            return 4 if n < 1024 else 8, 1 << (nb - 1).bit_length(), 4, 0, 1
        bn, cap, warps, mode = GEMV_TILES["legacy", _legacy_size(nbytes)]
    narrow = qt == QT.Q4_K and mode == 0 and n < NARROW_ROWS
    if qt == QT.Q4_K and (mode == 2 or narrow):  # the plane kernels mask a partial last step cheaply
        bb = min(cap, 1 << (nb.bit_length() - 1))
    else:
        bb = pow2_divisor(nb, cap)
    if qt in (QT.Q5_K, QT.Q6_K) and mode == 0 and bb == 1:
        warps = 2
    split = min(max_split, auto_split(n, nb, bn, bb, nbytes))
    if narrow:
        split = max(split, NARROW_SPLIT)
    return bn, bb, warps, mode, split
