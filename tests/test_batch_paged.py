"""The batched step's single rows through the paged decode attention, and the decode-only step on
fixed shapes (what CUDA graphs capture), on the CPU: the reference backend's paged attention
against float64 attention, the new path against the old per-sequence one, and the capturable
decode-only step against the general step, bit for bit; the decode-only step going through the
plugin the policy ranks first for ``batch_step``. GPU: cuda_graphs' replay against eager, and a
request alone against the same request among 127 others on the real 0.5B model.

Oracles: float64 softmax attention over each entry's gathered K/V; the old path (one prefill
attention call per single row over its sequence's gathered blocks); the general step's own bits
for the same rows (the decode-only step must not change them).
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from minfer_core.batch_engine import BatchEngine, Request
from minfer_core.batch_forward import batch_step, bucket, decode_rows
from minfer_core.engine import Engine
from minfer_core.reference import attention_paged_decode, attention_prefill
from minfer_core.sampling import SamplerConfig
from minfer_core.synth import synthesize, tiny_layout, write_layout
from minfer_core.weights import Candidate
from test_plugins import install_fake

ROOT = Path(__file__).resolve().parents[1]

GREEDY = SamplerConfig(temp=0)


def paged_inputs(lens, h=4, hkv=2, d=16, page=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = [-(-n // page) for n in lens]
    n_blocks = sum(nb) + 2
    k = torch.randn(n_blocks, page, hkv, d, generator=g).to(dtype)
    v = torch.randn(n_blocks, page, hkv, d, generator=g).to(dtype)
    order = torch.randperm(n_blocks, generator=g).tolist()
    tables = torch.full((len(lens), max(nb) + 3), order[-1], dtype=torch.int32)  # wider than needed
    for i, m in enumerate(nb):
        tables[i, :m] = torch.tensor([order.pop(0) for _ in range(m)], dtype=torch.int32)
    return torch.randn(len(lens), h, d, generator=g), k, v, tables, torch.tensor(lens, dtype=torch.int32)


def float64_attention(q, k, v, tables, lens):
    page, out = k.shape[1], []
    for b, n in enumerate(lens.tolist()):
        rows = torch.cat([torch.arange(p * page, (p + 1) * page) for p in tables[b].tolist()])[:n]
        kb, vb = k.flatten(0, 1)[rows].double(), v.flatten(0, 1)[rows].double()
        rep = q.shape[1] // k.shape[2]
        kb, vb = kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1)
        s = torch.einsum("hd,nhd->hn", q[b].double(), kb) / math.sqrt(q.shape[2])
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), vb).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_paged_attention_matches_float64_and_is_per_entry(dtype):
    q, k, v, tables, lens = paged_inputs([1, 9, 4, 23], dtype=dtype)
    got = attention_paged_decode(q, k, v, tables, lens)
    want = float64_attention(q, k, v, tables, lens)
    assert got.dtype == torch.float32 and got.shape == (4, 4 * 16)
    assert float((got.double() - want).abs().max()) < 1e-5
    for b in range(4):  # each entry alone: the same bits
        alone = attention_paged_decode(q[b:b + 1], k, v, tables[b:b + 1], lens[b:b + 1])
        assert torch.equal(alone[0], got[b])


def tiny_engine(tmp_path, qtype, **load):
    md, ts = tiny_layout("qwen2", qtype)
    write_layout(tmp_path / "t.layout.gguf", md, ts)
    synthesize(tmp_path / "t.layout.gguf", tmp_path / "t.gguf", progress=False)
    return Engine.load(tmp_path / "t.gguf", device="cpu", n_ctx=128, progress=False, **load)


def decoding(eng, prompts) -> tuple[BatchEngine, list]:
    """A batched engine whose requests all decode now, and the work of its next (decode-only) step."""
    be = BatchEngine(eng, parallel=len(prompts), max_queue=8, n_blocks=len(prompts) * 8, segment=32,
                     step_tokens=128)
    for ids in prompts:
        be.submit(Request(ids, 50, GREEDY, ignore_eos=True))
    while not (len(be.sched.running) == len(prompts) and all(s.decoding for s in be.sched.running)):
        be.step()
    work = be.sched.schedule()
    assert all(w.end - w.start == 1 for w in work) and len(work) == len(prompts)
    return be, work


def per_sequence_attention(q, k_pages, v_pages, tables, lens):
    """The old path: one prefill attention call per entry over its gathered blocks."""
    page, out = k_pages.shape[1], []
    for b, n in enumerate(lens.tolist()):
        blocks = tables[b, :-(-n // page)].long()
        ks, vs = k_pages.index_select(0, blocks).flatten(0, 1), v_pages.index_select(0, blocks).flatten(0, 1)
        out.append(attention_prefill(q[b:b + 1], ks[:n], vs[:n], n - 1)[0])
    return torch.stack(out)


def check_decode_paths(be, work, tol):
    """decode_rows on the padded bucket == the general step on the same rows (bitwise); the paged
    attention == the old per-sequence attention (to ``tol``)."""
    inputs = torch.from_numpy(be.packer.decode_only(work))
    assert inputs.shape[0] > len(work)  # padding entries present
    fixed = decode_rows(be.model, inputs, be.block_size, be.decode_mm, be.attn)[:len(work)]
    batch, sampled = be.packer.mixed(work, be.model.device)
    assert sampled == list(range(len(work))) and batch.n_single == len(work) and batch.call_rows == 0
    general = be.model.forward(batch_step(batch, be.block_size, be.step_mm, be.attn))
    assert torch.equal(fixed, general)
    old = be.model.forward(batch_step(batch, be.block_size, be.step_mm,
                                      Candidate("reference", "old.per_sequence", per_sequence_attention)))
    assert float((old - general).abs().max()) <= tol * float(old.abs().max())


def test_decode_only_step_equals_general_step_and_old_path_reference(tmp_path):
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference")
    assert eng.plan.attention["paged_decode"].label == "ref.attn.paged_decode"
    be, work = decoding(eng, [list(range(3, 3 + n)) for n in (5, 37, 20)])
    assert be.batch_step is None  # cuda_graphs never wraps on the CPU
    check_decode_paths(be, work, 1e-5)


def test_decode_only_step_equals_general_step_and_old_path_mmq(tmp_path):
    """The same under the mmq_triton kernels (Triton's interpreter on the CPU): paged kernel, fused
    RoPE + K/V write at per-row slots."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":  # a GPU machine: its kernels serve CUDA tensors only
        pytest.skip("mmq_triton runs on the CPU only under Triton's interpreter")
    eng = tiny_engine(tmp_path, QT.Q4_K)
    assert eng.plan.attention["paged_decode"].label == "mmq.attn.paged"
    assert eng.plan.prefill_ops["prefill_rope_kv"].label == "mmq.pre.rope_kv"
    be, work = decoding(eng, [list(range(3, 3 + n)) for n in (6, 21, 2)])
    # q and the probabilities rounded to f16 in the paged kernel (~5e-4 relative each), through two
    # layers of bf16 GEMMs: ~3e-3 of the largest logit measured; a wrong key or block is O(1)
    check_decode_paths(be, work, 1e-2)
    assert eng.model.rt.counts["mmq.attn.paged"] > 0 and eng.model.rt.counts["mmq.pre.rope_kv"] > 0


def test_an_engine_attends_with_what_the_paged_attention_offers_for_its_size(tmp_path):
    """``fn.for_engine(parallel)`` (optional): asked once per engine with its size; every step of
    that engine, decode-only and mixed, attends with what it returned."""
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference")
    plan_attn = eng.model.rt.attn_paged
    asked, used = [], Counter()

    class Offering:
        def __call__(self, *a):
            used["plan"] += 1
            return plan_attn.fn(*a)

        def for_engine(self, parallel):
            asked.append(parallel)

            def fn(*a):
                used[parallel] += 1
                return plan_attn.fn(*a)
            return fn

    eng.model.rt.attn_paged = Candidate("reference", plan_attn.label, Offering())
    try:
        for parallel in (1, 3):
            be = BatchEngine(eng, parallel=parallel, max_queue=8, n_blocks=24, segment=32, step_tokens=128)
            for i in range(parallel):
                be.submit(Request(list(range(3, 12 + i)), 4, GREEDY, ignore_eos=True))
            while be.step():
                pass
    finally:
        eng.model.rt.attn_paged = plan_attn
    assert asked == [1, 3] and used[1] > 0 and used[3] > 0 and used["plan"] == 0


def test_mmq_paged_attention_splits_less_for_big_engines():
    pytest.importorskip("triton")
    from minfer_mmq_triton.ops.paged_attention import FEW_SPLITS, FEW_SPLITS_ABOVE, PagedDecodeAttention

    att = PagedDecodeAttention()
    assert att.for_engine(1) is att and att.for_engine(FEW_SPLITS_ABOVE) is att
    big = att.for_engine(FEW_SPLITS_ABOVE + 1)
    assert big.nsplit == FEW_SPLITS < att.nsplit and big.for_engine(128) is big


def test_decode_only_steps_go_through_the_batch_step_wrapper(tmp_path, monkeypatch):
    """A plugin placed first in ``order.batch_step`` wraps the decode-only step once, at construction,
    and gets the padding entry; every decode-only step then goes through its wrapper (E entries,
    padded to a bucket with that padding row); ``graphs=False`` bypasses it."""
    monkeypatch.delenv("MINFER_LOAD_PLUGINS", raising=False)
    (tmp_path / "site").mkdir()
    mod = install_fake(tmp_path / "site", monkeypatch, """
        wraps, calls = [], []

        @hookimpl
        def minfer_wrap_batch_step(step, padding, ctx):
            wraps.append(padding)

            def wrapped(inputs):
                calls.append(inputs.clone())
                return step(inputs)

            return wrapped
    """, name="fakegraphs")
    text = (ROOT / "configs" / "gates.yaml").read_text()
    assert "  batch_step: [cuda_graphs]" in text
    policy = tmp_path / "policy.yaml"
    policy.write_text(text.replace("  batch_step: [cuda_graphs]", "  batch_step: [fakegraphs]"))
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference", policy=str(policy))
    assert eng.plan.batch_step_order == ["fakegraphs"] and eng.plan.decode_step is None
    fake = sys.modules[mod]
    assert fake.wraps == []  # the single-stream engine does not ask for it
    prompts = [list(range(3, 3 + n)) for n in (5, 37, 20)]
    tokens = {}
    for graphs in (None, False):
        be = BatchEngine(eng, parallel=3, max_queue=8, n_blocks=24, segment=32, step_tokens=128, graphs=graphs)
        reqs = [Request(ids, 4, GREEDY, ignore_eos=True) for ids in prompts]
        out = {r.id: [] for r in reqs}
        for r in reqs:
            r.on_event = lambda e: out[e.request_id].extend(e.token_ids)
            be.submit(r)
        n_calls = len(fake.calls)
        while be.step():
            pass
        tokens[graphs] = [out[r.id] for r in reqs]
        assert all(len(t) == 4 for t in tokens[graphs])
        if graphs is False:
            assert be.batch_step is None and len(fake.calls) == n_calls and len(fake.wraps) == 1
            continue
        assert len(fake.wraps) == 1 and be.batch_step is not None
        padding = fake.wraps[0]
        assert padding.dtype == torch.int64 and padding.shape == (be.packer.padding.shape[0],)
        # token 0 at position 0 in the scratch block (the block past the pool's n_blocks)
        assert padding[2].item() == 24 * be.block_size
        assert fake.calls, "no decode-only step went through the wrapper"
        real = []
        for x in fake.calls:
            n = int((x != padding).any(dim=1).sum())
            assert x.shape == (bucket(n), padding.shape[0]) and (x[n:] == padding).all()
            real.append(n)
        assert 3 in real  # all three decoding at once: 3 entries and one padding entry
    assert tokens[None] == tokens[False]


def test_a_plugins_row_invariant_kernels_serve_the_whole_step(tmp_path, monkeypatch):
    """A third-party plugin offering ``minfer_batch_matmul_candidates`` (row by row in float64 here)
    gets every weight of the batched step for the rows at generated positions and the output head:
    called once per weight with all of those rows (no padding to tiles), RMSNorm / SwiGLU /
    residual passed to it as its ``fuses`` says; a request's tokens stay the same alone or among
    others; ``rows=False`` leaves it out. Prompt rows run on the prefill kernels over prompt tiles,
    and in an engine of one sequence the plugin gets only the output head's row."""
    monkeypatch.delenv("MINFER_LOAD_PLUGINS", raising=False)
    (tmp_path / "site").mkdir()
    mod = install_fake(tmp_path / "site", monkeypatch, """
        import torch
        from minfer_core.dequant import dequantize
        from minfer_core.weights import Candidate

        calls = []

        @hookimpl
        def minfer_batch_matmul_candidates(weight, ctx):
            w = dequantize(weight.raw, weight.qtype, weight.n_in).double()
            b = None if weight.bias is None else weight.bias.double()

            def fn(x, residual=None, norm=None, swiglu=False):
                calls.append((weight.name, x.shape[0], norm is not None, swiglu, residual is not None))
                rows = []
                for r in x.double():  # one row at a time: nothing depends on the others
                    if norm is not None:
                        r = r * torch.rsqrt(r.pow(2).mean() + norm[1]) * norm[0].double()
                    if swiglu:
                        g, u = r.chunk(2)
                        r = g * torch.sigmoid(g) * u
                    rows.append(r @ w.T + (0 if b is None else b))
                y = torch.stack(rows).float()
                return y if residual is None else residual + y

            return [Candidate("fakerows", "fakerows.f64", fn, fuses=("residual", "rmsnorm", "swiglu"))]
    """, name="fakerows")
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "configs" / "gates.yaml").read_text().replace(
        "  decode: [mmq_triton, f16_wmma, reference]", "  decode: [fakerows, mmq_triton, f16_wmma, reference]"))
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference", policy=str(policy))
    fake = sys.modules[mod]
    assert set(eng.plan.batch) == set(eng.plan.decode)
    assert {c.label for c in eng.plan.batch.values()} == {"fakerows.f64"}
    assert all(c.plugin == "reference" for c in eng.plan.decode.values())  # it offers nothing else
    target, others = list(range(3, 40)), [list(range(50 + i, 61 + 7 * i)) for i in range(5)]

    def generate(be, batches):
        out = {}
        for batch in batches:
            reqs = [Request(ids, 6, GREEDY, ignore_eos=True) for ids in batch]
            for r in reqs:
                out[r.id] = []
                r.on_event = lambda e: out[e.request_id].extend(e.token_ids)
                be.submit(r)
            while be.step():
                pass
        return out, reqs

    be = BatchEngine(eng, parallel=6, max_queue=8, n_blocks=48, segment=32, step_tokens=128)
    assert be.rows
    out, (alone,) = generate(be, [[target]])
    fake.calls.clear()
    out2, reqs = generate(be, [[*others[:3], target, *others[3:]]])
    assert out2[reqs[3].id] == out[alone.id] and all(len(t) == 6 for t in out2.values())
    names = {c[0] for c in fake.calls}
    assert names == set(eng.plan.batch)
    counts = {c[1] for c in fake.calls}
    assert 6 in counts and any(n % 16 for n in counts)  # a whole decode step; steps not padded to tiles
    assert max(counts) == 8  # a decode step in its bucket of 8 entries at most: never prompt rows
    assert {c[2:] for c in fake.calls if "ffn_down" in c[0]} == {(False, True, True)}
    assert {c[2:] for c in fake.calls if c[0] == "output"} == {(True, False, False)}
    fake.calls.clear()
    tiled = BatchEngine(eng, parallel=6, max_queue=8, n_blocks=48, segment=32, step_tokens=128, rows=False)
    generate(tiled, [[target]])
    assert fake.calls == []

    # an engine of one sequence: its prompt rows on the prefill kernels over 16-row tiles, its decode
    # steps on the plan's decode kernels (as the single-stream engine runs them); a prefix hit
    # changes nothing
    rt = eng.model.rt
    tiled_rows = []
    tiled_linear = rt.tiled_linear
    monkeypatch.setattr(rt, "tiled_linear", lambda n, a, tile: (tiled_rows.append((n, a.rows, tile)),
                                                                tiled_linear(n, a, tile))[1])
    single = BatchEngine(eng, parallel=1, max_queue=8, n_blocks=48, segment=32, step_tokens=128)
    before = Counter(rt.counts)
    first, (r1,) = generate(single, [[target]])
    assert fake.calls == [("output", 1, True, False, False)]  # the prompt step's logits only
    assert {(r, t) for _, r, t in tiled_rows} == {(48, 16)}  # 37 prompt rows in three 16-row tiles
    assert {n for n, _, _ in tiled_rows} == set(eng.plan.prefill) - {"output"}
    assert all(rt.counts[c.label] >= before[c.label] + 5 for c in eng.plan.decode.values())  # 5 decode steps
    fake.calls.clear()
    tiled_rows.clear()
    again, (r2,) = generate(single, [[target]])
    assert again[r2.id] == first[r1.id] and len(first[r1.id]) == 6
    assert {(r, t) for _, r, t in tiled_rows} == {(16, 16)}  # the prompt's first segment was reused


def test_every_pass_runs_the_models_one_forward_and_block(tmp_path, monkeypatch):
    """A prompt, a single-stream decode step and a batched step each go through
    ``Transformer.forward`` once, with their own attention layout, and run ``Transformer.layer`` once
    per layer, in order, with their own matmuls (prompt, decode, batched prompt tiles, batched rows)."""
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference")
    model, seen, steps = eng.model, [], []
    layer, forward = model.layer, model.forward
    monkeypatch.setattr(model, "layer", lambda i, h, mm, attend: (seen.append((i, type(mm).__name__)),
                                                                  layer(i, h, mm, attend))[1])
    monkeypatch.setattr(model, "forward", lambda step: (steps.append(type(step.attention).__name__),
                                                        forward(step))[1])
    n = eng.cfg.n_layers
    eng.prefill(list(range(3, 40)))
    assert seen == [(i, "PromptMatmuls") for i in range(n)] and steps == ["ContiguousPrompt"]
    seen.clear()
    eng.decode(5)
    assert seen == [(i, "DecodeMatmuls") for i in range(n)] and steps[1:] == ["ContiguousToken"]
    seen.clear()
    be = BatchEngine(eng, parallel=2, max_queue=4, n_blocks=16, segment=32, step_tokens=64)
    be.submit(Request(list(range(3, 20)), 2, GREEDY, ignore_eos=True))
    while be.step():
        pass
    assert seen == [(i, "TiledPromptMatmuls") for i in range(n)] + [(i, "BatchMatmuls") for i in range(n)]
    assert steps[2:] == ["PagedRows", "PagedRows"]


def test_every_row_of_a_step_is_a_single_row_or_in_one_call(tmp_path):
    """The general step leaves its attention output uninitialized: each row must be written by one
    of the two attention phases, i.e. be exactly one single row or one row of one call."""
    eng = tiny_engine(tmp_path, QT.Q8_0, backend="reference")
    be = BatchEngine(eng, parallel=4, max_queue=8, n_blocks=64, segment=16, step_tokens=40)
    batches = []
    pack = be.packer.mixed

    def spy(work, device):
        batch, sampled = pack(work, device)
        batches.append(batch)
        return batch, sampled

    be.packer.mixed = spy
    for n in (5, 37, 20, 61):
        be.submit(Request(list(range(3, 3 + n)), 6, GREEDY, ignore_eos=True))
    while be.step():
        pass
    mixed = 0
    for b in batches:
        rows = b.single_rows[:b.n_single].tolist() + [r for f, k, _, _ in b.calls.tolist() for r in range(f, f + k)]
        assert sorted(rows) == list(range(b.tokens.shape[0]))
        mixed += b.n_single > 0 and b.calls.shape[0] > 0
    assert mixed, "no step mixed single rows with prompt calls"


# -- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 3, 8, 100])
def test_gpu_graph_replay_equals_eager(synth_05b, n):
    be = BatchEngine.load(synth_05b, n_ctx=512, parallel=n, max_queue=n, progress=False, solo=False)
    assert be.engine.plan.batch_step.plugin == "cuda_graphs"
    graphs = be.batch_step.fn  # cuda_graphs' BatchGraphs
    g = torch.Generator().manual_seed(n)
    lengths = torch.randint(4, 200, (n,), generator=g).tolist()
    prompts = [torch.randint(0, 1000, (k,), generator=g).tolist() for k in lengths]
    be, work = decoding_gpu(be, prompts)
    inputs = torch.from_numpy(be.packer.decode_only(work)).to(be.model.device)
    eager = be._decode_step(inputs).clone()
    graphed = be.batch_step(inputs).clone()
    assert inputs.shape[0] in graphs.graphs and not graphs.failed
    assert torch.equal(graphed, eager)
    batch, _ = be.packer.mixed(work, be.model.device)
    assert torch.equal(be.model.forward(batch_step(batch, be.block_size, be.decode_mm, be.attn)), eager[:n])
    assert be.model.rt.counts["mmq.attn.paged"] > 0


@pytest.mark.cuda
def test_gpu_graphs_off_without_the_cuda_graphs_plugin(synth_05b):
    be = BatchEngine.load(synth_05b, n_ctx=256, parallel=2, max_queue=2, blocked=("cuda_graphs",), progress=False)
    assert be.batch_step is None and be.engine.plan.batch_step is None


@pytest.mark.cuda
def test_gpu_graphs_off_with_graphs_false(synth_05b):
    be = BatchEngine.load(synth_05b, n_ctx=256, parallel=2, max_queue=2, graphs=False, progress=False)
    assert be.batch_step is None and be.engine.plan.batch_step.plugin == "cuda_graphs"


def decoding_gpu(be, prompts):
    for ids in prompts:
        be.submit(Request(ids, 50, GREEDY, ignore_eos=True))
    while not (len(be.sched.running) == len(prompts) and all(s.decoding for s in be.sched.running)):
        be.step()
    return be, be.sched.schedule()


@pytest.mark.cuda
@pytest.mark.parametrize("shared_prefix", [False, True])
def test_gpu_alone_vs_among_127_others_bitwise(synth_05b, shared_prefix):
    """A request's greedy tokens and logits alone (graph of bucket 1) equal its tokens among 127
    others arriving around it (mixed eager steps, graphs of larger buckets); with
    ``shared_prefix`` its prompt is 3 segments long, so its second run starts from a prefix hit."""
    be = BatchEngine.load(synth_05b, n_ctx=1024, parallel=128, max_queue=256, progress=False)
    g = torch.Generator().manual_seed(1)
    target = be.tok.encode("def quicksort(items):", add_special=True)
    if shared_prefix:
        target = torch.randint(0, 1000, (200,), generator=g).tolist() + target
    logits: dict[str, list] = {}
    pick = be._greedy_tokens

    def recording(seqs, rows):
        for s, row in zip(seqs, rows):
            logits.setdefault(s.id, []).append(row.float().cpu())
        return pick(seqs, rows)

    be._greedy_tokens = recording
    out: dict[str, list[int]] = {}

    def req(ids):
        return Request(ids, 64, GREEDY, ignore_eos=True,
                       on_event=lambda e: out.setdefault(e.request_id, []).extend(e.token_ids))

    alone = req(target)
    be.submit(alone)
    while be.step():
        pass
    hits = be.pool.hits
    lengths = torch.randint(4, 300, (127,), generator=g).tolist()
    others = [req(torch.randint(0, 1000, (k,), generator=g).tolist()) for k in lengths]
    again = req(target)
    for r in others[:60]:
        be.submit(r)
    for _ in range(3):
        be.step()
    be.submit(again)
    for r in others[60:]:
        be.submit(r)
    while be.step():
        pass
    assert out[again.id] == out[alone.id] and len(out[alone.id]) == 64
    assert all(torch.equal(a, b) for a, b in zip(logits[again.id], logits[alone.id]))
    assert (be.pool.hits > hits) == shared_prefix
    assert be.pool.n_free == be.pool.n_blocks
    assert be.batch_step.fn.graphs and not be.batch_step.fn.failed
