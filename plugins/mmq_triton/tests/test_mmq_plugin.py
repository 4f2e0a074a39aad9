"""Hook behaviour: gates -> routes, labels, what registration builds, producers, delegation."""

import importlib.util

import pluggy
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from minfer_core import hookspecs
from minfer_core.weights import Weight


def _w(qt, n=32, k=256):
    from minfer_mmq_triton.synth import random_raw

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return Weight(f"w.{qt.name}", qt, (n, k), random_raw(qt, n, k, dev), "o")


def _offer(w, ctx):
    from minfer_mmq_triton import plugin

    plugin.minfer_register_weight(weight=w, ctx=ctx)
    cands = plugin.minfer_matmul_candidates(weight=w, phase="prefill", ctx=ctx)
    return None if cands is None else cands[0].label


def test_hooks_match_specs():
    from minfer_mmq_triton import plugin

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(plugin)
    pm.check_pending()


@pytest.mark.parametrize("over,expect", [
    ({}, {QT.Q4_K: "mmq.nb.q4_k", QT.Q6_K: "mmq.nb.q6_k", QT.Q8_0: "mmq.generic.q8_0", QT.Q5_K: "mmq.generic.q5_k"}),
    ({"MINFER_MMQ": False}, {QT.Q4_K: None, QT.Q6_K: None, QT.Q8_0: None}),
    ({"MINFER_MMQ_RAW": False}, {QT.Q4_K: "mmq.raw_off.q4_k", QT.Q5_0: "mmq.raw_off.q5_0"}),
    ({"MINFER_MMQ_RAW_NB": False}, {QT.Q4_K: "mmq.generic.q4_k", QT.Q6_K: "mmq.generic.q6_k"}),
    ({"MINFER_MMQ_Q6K_NB": False}, {QT.Q4_K: "mmq.nb.q4_k", QT.Q6_K: "mmq.generic.q6_k"}),
    ({"MINFER_MMQ_Q4K_DSC": False}, {QT.Q4_K: "mmq.nb.raw.q4_k", QT.Q6_K: "mmq.nb.q6_k"}),
    ({"MINFER_MMQ_Q6K_EXP": False}, {QT.Q4_K: "mmq.nb.q4_k", QT.Q6_K: "mmq.nb.raw.q6_k"}),
])
def test_gates_pick_labels(over, expect, make_ctx):
    ctx = make_ctx(**over)
    for qt, label in expect.items():
        assert _offer(_w(qt), ctx) == label, (over, qt)


def test_registration_builds_only_what_the_route_reads(make_ctx):
    from minfer_mmq_triton import planes

    w = _w(QT.Q4_K)
    _offer(w, make_ctx())
    assert set(w.planes) == {planes.KEY_Q4K} and w.raw is not None  # the core releases raw after planning
    for over in ({"MINFER_MMQ": False}, {"MINFER_MMQ_RAW_NB": False}, {"MINFER_MMQ_Q4K_DSC": False}):
        w = _w(QT.Q4_K)
        _offer(w, make_ctx(**over))
        assert w.planes == {}, over
    w = _w(QT.Q6_K)
    _offer(w, make_ctx(MINFER_MMQ_RAW=False))
    assert set(w.planes) == {planes.KEY_W16} and w.planes[planes.KEY_W16].dtype == torch.bfloat16


@pytest.mark.parametrize("over,small", [
    ({}, {QT.Q4_K: True, QT.Q6_K: True, QT.Q8_0: False, QT.Q5_0: False}),  # the fused GEMM over built planes
    ({"MINFER_MMQ_Q4K_DSC": False}, {QT.Q4_K: False}),  # no plane: raw blocks expanded per call
    ({"MINFER_MMQ_RAW": False}, {QT.Q4_K: False}),
])
def test_small_tiles_only_where_no_weight_is_expanded_per_call(over, small, make_ctx):
    from minfer_mmq_triton import plugin

    ctx = make_ctx(**over)
    for qt, expect in small.items():
        w = _w(qt)
        plugin.minfer_register_weight(weight=w, ctx=ctx)
        (c,) = plugin.minfer_matmul_candidates(weight=w, phase="prefill", ctx=ctx)
        assert c.small_tiles is expect, (over, qt)


def test_float_and_unserved_types_get_nothing(make_ctx):
    w = Weight("f", QT.F16, (8, 32), torch.zeros(8, 64, dtype=torch.uint8), "o")
    assert _offer(w, make_ctx()) is None
    q3 = Weight("q3", QT.Q3_K, (8, 256), torch.zeros(8, 110, dtype=torch.uint8), "o")
    assert _offer(q3, make_ctx()) is None


def test_producers(make_ctx):
    from minfer_mmq_triton import plugin

    def labels(kind, **kw):
        c = getattr(plugin, f"minfer_{kind}_candidates")(ctx=make_ctx(**kw))
        return None if c is None else c[0].label

    assert labels("rmsnorm", fuse_mode=2) == "mmq.fuse2.rmsnorm"
    assert labels("swiglu", fuse_mode=1) == "mmq.fuse1.swiglu"
    assert labels("rmsnorm", fuse_mode=0) is None
    assert labels("prepass", fuse_mode=0) == "mmq.prepass"
    assert labels("prepass", fuse_mode=0, MINFER_MMQ_A_TRANSPOSE=False) is None
    assert labels("swiglu", fuse_mode=2, MINFER_MMQ=False) is None
    x = torch.randn(16, 64, device=make_ctx().device)
    act = plugin.minfer_rmsnorm_candidates(ctx=make_ctx(fuse_mode=2))[0].fn(
        x, torch.ones(64, device=x.device), 1e-6)
    assert act.f32 is None and act.plane.shape == (16, 64)


def test_applicability(make_ctx, monkeypatch):
    from minfer_core.weights import LoadContext
    from minfer_mmq_triton import plugin

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert plugin.minfer_applicable(ctx=make_ctx(device="cpu")) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "compute capability" in plugin.minfer_applicable(ctx=make_ctx(device="cpu"))
    old = LoadContext(torch.device("cuda"), (7, 5), {})
    assert "7.5" in plugin.minfer_applicable(ctx=old)
    assert plugin.minfer_applicable(ctx=LoadContext(torch.device("cuda"), (9, 0), {})) is None


def test_decode_and_attention_delegation(make_ctx):
    from minfer_mmq_triton import plugin

    ctx = make_ctx()
    if importlib.util.find_spec("minfer_mmq_triton.decode") is None:
        assert plugin.minfer_matmul_candidates(weight=_w(QT.Q4_K), phase="decode", ctx=ctx) is None
    if importlib.util.find_spec("minfer_mmq_triton.ops.attention") is None:
        assert plugin.minfer_attention_candidates(phase="decode", ctx=ctx) is None


def test_pdl_only_on_hopper_and_not_when_switched_off(monkeypatch):
    """Programmatic dependent launch needs compute capability 9.0; MINFER_PDL=0 turns it off."""
    from minfer_core.weights import LoadContext
    from minfer_mmq_triton.launch import pdl

    monkeypatch.delenv("MINFER_PDL", raising=False)
    hopper = LoadContext(torch.device("cuda"), (9, 0), {})
    assert pdl.enabled(hopper)
    assert not pdl.enabled(LoadContext(torch.device("cuda"), (8, 0), {}))
    assert not pdl.enabled(LoadContext(torch.device("cpu"), None, {}))
    assert not pdl.enabled(None)
    monkeypatch.setenv("MINFER_PDL", "0")  # read by the core at load, never by the plugin
    assert pdl.enabled(hopper)
    assert not pdl.enabled(LoadContext(torch.device("cuda"), (9, 0), {"MINFER_PDL": False}))
    # launch keywords: the attribute only with PDL; a GEMV prefetches nothing without it
    assert pdl.launch_args(False) == {"PDL": False}
    assert pdl.gemv_launch_args(False, 8) == {"PDL": False, "PF": 0}
    assert pdl.gemv_launch_args(True, 8) == {"PDL": True, "launch_pdl": True, "PF": 8}
    assert pdl.prefetch_lines(896, 896) > 0 and pdl.prefetch_lines(37888, 3584) == 0


def test_wgmma_gemm_only_on_hopper_with_the_mma_switch():
    """The warpgroup-MMA GEMM serves loads on compute capability 9.0 with MINFER_DECODE_MMA on, nowhere
    else (wgmma is Hopper's; other GPUs keep the fused GEMM)."""
    from minfer_core.weights import LoadContext
    from minfer_mmq_triton.decode import wgmma_enabled

    def ctx(device, cc, mma=True):
        return LoadContext(device=torch.device(device), compute_capability=cc,
                           gates={"MINFER_DECODE_MMA": mma}, fuse_mode=2)

    pytest.importorskip("triton.experimental.gluon")
    assert wgmma_enabled(ctx("cuda", (9, 0)))
    assert not wgmma_enabled(ctx("cuda", (9, 0), mma=False))
    assert not any(wgmma_enabled(ctx("cuda", cc)) for cc in ((8, 0), (8, 9), (10, 0), (12, 0)))
    assert not wgmma_enabled(ctx("cpu", None))


def test_wgmma_gemm_split_and_tile_from_the_shape():
    """Split-K from the weight's shape alone: at the 7B's shapes the split the H200 measured fastest
    (benchmarks/README.md: 8 for qkv, o and down) or within 6% of it (1 for gate|up); the MMA's N a
    power of two of at least 8 rows covering the call's rows."""
    from minfer_mmq_triton import tiles

    assert [tiles.wgmma_split(n, k) for n, k in ((4608, 3584), (3584, 3584), (3584, 18944))] == [8, 8, 8]
    assert tiles.wgmma_split(37888, 3584) == 1
    assert [tiles.wgmma_rows(m) for m in (1, 8, 9, 16, 17, 33, 64)] == [8, 8, 16, 16, 32, 64, 64]


def test_async_gemm_route_from_rows_and_shape():
    """The asynchronous warpgroup-MMA GEMM serves what the H200 measured it faster for
    (benchmarks/README.md): q4_K weights of 48M values or more (the 7B's gate|up and down) and q6_K
    ones of more inputs than outputs (down) at 65-128 rows; not qkv or o (expand + cuBLAS was faster),
    not the q6_K output head (not timed), not at 64 rows (the synchronous GEMM) or from 129 on (the
    warp-specialized GEMM, expand + cuBLAS). Its split-K fills the grid only where the grid is small:
    4 for down at 128 rows (the split measured, q4_K and q6_K), 1 for gate|up."""
    from minfer_mmq_triton import tiles

    gate_up, down, qkv, o, head = (37888, 3584), (3584, 18944), (4608, 3584), (3584, 3584), (152064, 3584)
    for m in (65, 100, 128):
        assert tiles.async_route(QT.Q4_K, m, *gate_up) and tiles.async_route(QT.Q4_K, m, *down)
        assert not tiles.async_route(QT.Q4_K, m, *qkv) and not tiles.async_route(QT.Q4_K, m, *o)
        assert tiles.async_route(QT.Q6_K, m, *down) and not tiles.async_route(QT.Q6_K, m, *head)
    assert not any(tiles.async_route(QT.Q4_K, m, *gate_up) for m in (16, 64, 129, 512))
    assert not any(tiles.async_route(QT.Q6_K, m, *down) for m in (64, 129))
    assert tiles.async_split(128, *down) == 4 and tiles.async_split(128, *gate_up) == 1
    assert tiles.async_split(128, *down, tiles.async_tile(QT.Q6_K)) == 4


def test_ws_gemm_route_from_rows_and_shape():
    """The warp-specialized GEMM serves what the GPUs measured it faster for than expand + cuBLAS
    (benchmarks/README.md, ``tiles``): the 7B's q4_K gate|up at 129-512 rows and down (more inputs than
    outputs, q4_K or q6_K) at 129-256; its q4_K qkv and o (12M values or more) from 65 rows while one
    round of tiles covers the call (qkv to 256 rows, o to 512), at the 128-row tile up to 128 rows;
    not k or v (fewer values), not a q6_K of fewer inputs than outputs, not at 64 rows (the
    synchronous GEMM), not gate|up or down at 128 rows (the asynchronous GEMM) or above 512. down at
    256 rows splits K 2 ways (the fastest of 1, 2 and 4), gate|up not at all, o 2 ways up to 256 rows."""
    from minfer_mmq_triton import tiles

    gate_up, down, qkv, o, k = (37888, 3584), (3584, 18944), (4608, 3584), (3584, 3584), (512, 3584)
    for m in (129, 256, 512):
        assert tiles.ws_route(QT.Q4_K, m, *gate_up)
        assert tiles.ws_route(QT.Q4_K, m, *down) == tiles.ws_route(QT.Q6_K, m, *down) == (m <= 256)
        assert not tiles.ws_route(QT.Q6_K, m, *gate_up)
    for m in (65, 128, 129, 256):
        assert tiles.ws_route(QT.Q4_K, m, *qkv) and tiles.ws_route(QT.Q4_K, m, *o)
        assert not tiles.ws_route(QT.Q4_K, m, *k) and not tiles.ws_route(QT.Q6_K, m, *k)
    assert tiles.ws_route(QT.Q4_K, 512, *o) and not tiles.ws_route(QT.Q4_K, 384, *qkv)
    assert not any(tiles.ws_route(QT.Q4_K, m, *w) for m in (64, 513, 3314) for w in (gate_up, qkv, o))
    assert not tiles.ws_route(QT.Q4_K, 128, *gate_up) and not tiles.ws_route(QT.Q6_K, 128, *o)
    assert tiles.ws_tile(128) == tiles.WS_SMALL_TILE and tiles.ws_tile(129) == tiles.WS_TILE
    assert tiles.ws_split(256, *down) == 2 and tiles.ws_split(512, *gate_up) == 1
    assert tiles.ws_split(256, *o) == tiles.ws_split(128, *o, tiles.WS_SMALL_TILE) == 2


def test_batched_step_puts_wide_q4k_weights_on_the_wgmma_gemm_on_hopper():
    """The batched step's candidates: on compute capability 9.0, q4_K weights with no more inputs than
    outputs (the 7B's qkv, o, gate|up) on the warpgroup-MMA GEMM; the 7B's down (18,944 inputs) and
    q6_K weights on the rows GEMMs; on 8.0 every q4_K / q6_K weight on the rows GEMMs; no candidate
    for other types. Weights without data give planning-only candidates (``minfer gates -m``)."""
    from minfer_core.weights import LoadContext, Weight
    from minfer_mmq_triton.batch import batch_candidates

    pytest.importorskip("triton.experimental.gluon")

    def label(qt, n, k, cc):
        ctx = LoadContext(device=torch.device("cuda"), compute_capability=cc, gates={}, fuse_mode=2)
        got = batch_candidates(Weight("w", qt, (n, k), None, "o"), ctx)
        return got[0].label if got else None

    hopper, ampere = (9, 0), (8, 0)
    assert [label(QT.Q4_K, n, k, hopper) for n, k in ((4608, 3584), (3584, 3584), (37888, 3584))] == \
        ["mmq.rows.wgmma.q4_k"] * 3
    assert label(QT.Q4_K, 3584, 18944, hopper) == "mmq.rows.q4_k"
    assert label(QT.Q6_K, 152064, 3584, hopper) == label(QT.Q6_K, 3584, 18944, hopper) == "mmq.rows.q6_k"
    assert label(QT.Q4_K, 4608, 3584, ampere) == "mmq.rows.q4_k"
    assert label(QT.Q5_0, 4608, 3584, hopper) is None
