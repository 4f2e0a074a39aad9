"""The model's one forward takes what a pass is as inputs (``minfer_core.step.Step``): a new kind of
pass is a new attention layout, not a new forward. Here a layout written from first principles
(RoPE by hand, K/V in a pool of its own through a shuffled block table, torch's SDPA) runs a real
model's prompt in two chunks and must give the logits of the built-in prompt pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from minfer_core.engine import Engine
from minfer_core.matmuls import PromptMatmuls
from minfer_core.step import ContiguousPrompt, Step
from minfer_core.weights import Activation

BLOCK = 4


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate x (T, heads, D) by angle tables (T, D/2), as complex multiplication: each pair (j, j +
    D/2) for NeoX, (2j, 2j + 1) otherwise (llama.cpp's two RoPE types) is one complex number."""
    turn = torch.complex(cos, sin)[:, None, :]
    if neox:
        a, b = x.chunk(2, dim=-1)
        z = torch.complex(a, b) * turn
        return torch.cat([z.real, z.imag], dim=-1)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous()) * turn
    return torch.view_as_real(z).flatten(-2)


class SdpaPaged:
    """One sequence's rows at ``positions`` (host ints, consecutive), K/V kept in ``pool`` (layers,
    blocks, BLOCK, Hkv, D) at the blocks ``table`` lists, in order."""

    def __init__(self, pool_k, pool_v, table: list[int], start: int):
        self.k, self.v, self.table, self.start = pool_k, pool_v, table, start

    def __call__(self, model, i, q, k, v, cos, sin):
        cfg = model.cfg
        T, H, Hkv, D = q.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        neox = cfg.rope_style == "neox"
        q = rope(q.reshape(T, H, D).float(), cos, sin, neox)
        k = rope(k.reshape(T, Hkv, D).float(), cos, sin, neox)
        for t in range(T):
            pos = self.start + t
            blk, off = self.table[pos // BLOCK], pos % BLOCK
            self.k[i, blk, off], self.v[i, blk, off] = k[t], v.reshape(T, Hkv, D)[t].float()
        end = self.start + T
        blocks = torch.tensor(self.table[:-(-end // BLOCK)])
        ks = self.k[i, blocks].flatten(0, 1)[:end].repeat_interleave(H // Hkv, dim=1)  # (end, H, D)
        vs = self.v[i, blocks].flatten(0, 1)[:end].repeat_interleave(H // Hkv, dim=1)
        mask = torch.arange(end)[None, :] <= torch.arange(self.start, end)[:, None]  # causal
        o = F.scaled_dot_product_attention(q.transpose(0, 1), ks.transpose(0, 1), vs.transpose(0, 1),
                                           attn_mask=mask)
        return o.transpose(0, 1).reshape(T, H * D)


@pytest.fixture(scope="module")
def smollm(smollm_path):
    return Engine.load(smollm_path, backend="reference", device="cpu", n_ctx=64)


def test_a_new_attention_layout_runs_through_the_one_forward(smollm):
    model = smollm.model
    cfg = model.cfg
    ids = smollm.tok.encode("The quick brown fox jumps over the lazy dog, then naps.", add_special=True)
    n, split = len(ids), 7
    want = model.prompt(torch.tensor(ids), 0, all_logits=True)

    n_blocks = -(-n // BLOCK) + 3
    table = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    assert table != sorted(table)
    shape = (cfg.n_layers, n_blocks, BLOCK, cfg.n_kv_heads, cfg.head_dim)
    pool_k, pool_v = torch.zeros(shape), torch.zeros(shape)
    got = []
    for lo, hi in ((0, split), (split, n)):
        step = Step(torch.tensor(ids[lo:hi]), torch.arange(lo, hi), SdpaPaged(pool_k, pool_v, table, lo),
                    PromptMatmuls(model.rt))
        got.append(model.forward(step))
    got = torch.cat(got)

    assert got.shape == want.shape == (n, cfg.vocab_size)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    err = float((got - want).abs().max())
    assert err <= 2e-3 * float(want.abs().max()), err


def test_logit_rows_pick_rows_and_may_be_empty(smollm):
    model = smollm.model
    ids = torch.tensor(smollm.tok.encode("one two three four five", add_special=True))
    full = model.prompt(ids, 0, all_logits=True)

    def run(rows):
        return model.forward(Step(ids, torch.arange(len(ids)), ContiguousPrompt(0), PromptMatmuls(model.rt), rows))

    assert torch.allclose(run(torch.tensor([2, 0])), full[[2, 0]], atol=1e-3, rtol=1e-3)
    assert run(torch.tensor([], dtype=torch.long)).shape == (0, model.cfg.vocab_size)


def _plain_decode(smollm):
    """A short prompt's cache, then one decode step's logits: ``(model, runtime, ids, pos, logits)``."""
    model = smollm.model
    ids = torch.tensor(smollm.tok.encode("one two three", add_special=True))
    pos = torch.tensor([len(ids)])
    model.prompt(ids, 0)
    return model, model.rt, ids, pos, model.decode_step(ids[-1:], pos)


def test_decode_attention_forms_reach_only_the_matmuls_that_read_them(smollm):
    """A decode attention may return an ``Activation`` carrying other forms of its output (the
    mmq plugin's quantized copy); the core hands ``forms=`` to the decode matmul whose candidate's
    ``reads`` names one, plain f32 rows to every other, and the logits stay those of the plain step."""
    model, rt, ids, pos, plain = _plain_decode(smollm)

    attn, o_name = rt.attn_decode, "blk.0.attn_output"
    o, seen = rt.plan.decode[o_name], []

    def attend(*args):
        out = attn.fn(*args)
        return Activation(out, forms={"test.form": ("marker", out.numel()), "test.other": None})

    def o_fn(x, forms=None, **kw):
        seen.append((type(x), forms))
        return o.fn(x, **kw)

    rt.attn_decode = dataclasses.replace(attn, fn=attend)
    rt.plan.decode[o_name] = dataclasses.replace(o, fn=o_fn, reads=("f32", "test.form"))
    try:  # the same step again: it rewrites the same cache row
        got = model.decode_step(ids[-1:], pos)
    finally:
        rt.attn_decode, rt.plan.decode[o_name] = attn, o
    assert torch.equal(got, plain)
    q_dim = model.cfg.n_heads * model.cfg.head_dim
    assert seen == [(torch.Tensor, {"test.form": ("marker", q_dim)})]  # layer 0's o; the others got f32 alone


def test_a_gate_up_glu_form_reaches_the_down_matmul(smollm):
    """A decode gate|up candidate that ``fuses`` ``"glu_out"`` is asked for it (its product feeds only the
    SwiGLU) and may return an ``Activation`` whose forms hold ``silu(g) * u``; the core hands those the
    down candidate ``reads`` to it with ``swiglu=True``, and the logits stay those of the plain step."""
    model, rt, ids, pos, plain = _plain_decode(smollm)

    gu_name, down_name = "blk.0.ffn_gate_up", "blk.0.ffn_down"
    gu, down, seen = rt.plan.decode[gu_name], rt.plan.decode[down_name], []

    def gu_fn(x, glu_out=False, **kw):
        y = gu.fn(x, **kw)
        seen.append(("gate_up", glu_out))
        return Activation(y, forms={"test.glu": ("marker", y.shape[1] // 2)}) if glu_out else y

    def down_fn(x, swiglu=False, forms=None, **kw):
        seen.append(("down", swiglu, forms))
        g, u = x.chunk(2, dim=-1)
        return down.fn(F.silu(g) * u, **kw)

    rt.plan.decode[gu_name] = dataclasses.replace(gu, fn=gu_fn, fuses=gu.fuses + ("glu_out",))
    rt.plan.decode[down_name] = dataclasses.replace(down, fn=down_fn, fuses=("swiglu",),
                                                    reads=("f32", "test.glu"))
    try:  # the same step again: it rewrites the same cache row
        got = model.decode_step(ids[-1:], pos)
    finally:
        rt.plan.decode[gu_name], rt.plan.decode[down_name] = gu, down
    assert torch.equal(got, plain)
    ffn = model.cfg.n_ff
    assert seen == [("gate_up", True), ("down", True, {"test.glu": ("marker", ffn)})]


def test_a_prefill_matmul_that_fuses_the_residual_is_handed_it(smollm):
    """A prefill candidate whose ``fuses`` holds ``"residual"`` gets the block's residual
    (``fn(act, residual=r)``) and returns ``r + x @ W.T`` itself; one without it never sees the
    keyword (the core adds). The prompt's logits stay those of the plain pass."""
    model = smollm.model
    rt = model.rt
    ids = torch.tensor(smollm.tok.encode("one two three four five six seven eight nine ten " * 3,
                                         add_special=True))
    assert ids.shape[0] >= 16  # prefill kernels
    plain = model.prompt(ids, 0)
    o_name, down_name = "blk.0.attn_output", "blk.0.ffn_down"
    o, down, seen = rt.plan.prefill[o_name], rt.plan.prefill[down_name], []

    def o_fn(act, residual=None):
        seen.append(("o", None if residual is None else tuple(residual.shape)))
        return residual + o.fn(act)

    def down_fn(act, **kw):
        seen.append(("down", sorted(kw)))
        return down.fn(act)

    rt.plan.prefill[o_name] = dataclasses.replace(o, fn=o_fn, fuses=("residual",))
    rt.plan.prefill[down_name] = dataclasses.replace(down, fn=down_fn, fuses=())
    try:
        got = model.prompt(ids, 0)
    finally:
        rt.plan.prefill[o_name], rt.plan.prefill[down_name] = o, down
    assert torch.equal(got, plain)
    assert seen == [("o", (ids.shape[0], model.cfg.n_embd)), ("down", [])]


def test_only_the_swiglu_input_may_come_back_in_bf16(smollm):
    """``bf16_out`` is asked only of the products that feed the SwiGLU alone (a layer's ffn input
    weights) and only of candidates that fuse it; given a bf16 ``[g | u]``, the SwiGLU (a plugin's or
    the core's) and the rest of the prompt run on: the logits within bf16 rounding of the plain
    pass's, the same next token."""
    model = smollm.model
    rt = model.rt
    ids = torch.tensor(smollm.tok.encode("one two three four five six seven eight nine ten " * 3,
                                         add_special=True))
    plain = model.prompt(ids, 0)
    saved, asked = dict(rt.plan.prefill), []

    def wrap(name, c):
        def fn(act, out_bf16=False, **kw):
            if out_bf16:
                asked.append(name)
                return c.fn(act, **kw).to(torch.bfloat16)
            return c.fn(act, **kw)
        return dataclasses.replace(c, fn=fn, fuses=tuple(c.fuses) + ("bf16_out",))

    rt.plan.prefill.update({n: wrap(n, c) for n, c in saved.items()})
    try:
        got = model.prompt(ids, 0)
    finally:
        rt.plan.prefill.clear()
        rt.plan.prefill.update(saved)
    ffn = [n for lw in model.p.layers for n in lw.ffn]
    assert asked == ffn and got.dtype == torch.float32
    assert not torch.equal(got, plain)
    assert ((got - plain).norm() / plain.norm()).item() < 1e-2  # bf16's 2^-9 steps, here ~2e-3
    assert torch.equal(got.argmax(-1), plain.argmax(-1))


def _plane_reader(c, reads, got: list):
    """Candidate ``c`` declaring ``reads``: records whether each call's Activation came without f32
    rows, and multiplies the bf16 plane (its own, else the f32 rows rounded)."""
    def fn(act, **kw):
        got.append(act.f32 is None)
        plane = act.plane if act.plane is not None else act.f32.to(torch.bfloat16)
        return c.fn(Activation(plane.float(), plane), **kw)
    return dataclasses.replace(c, fn=fn, reads=reads)


def test_the_attention_writes_the_plane_when_o_reads_nothing_else(smollm):
    """A prefill attention that fuses ``"plane"`` is asked for its output as the bf16 plane alone
    exactly when the layer's o matmul reads only the plane; o then gets that Activation (no f32
    rows, no prepass) and the prompt's logits stay within bf16 rounding of the plain pass's."""
    model = smollm.model
    rt, plan = model.rt, model.rt.plan
    ids = torch.tensor(smollm.tok.encode("one two three four five six seven eight nine ten " * 3,
                                         add_special=True))
    plain = model.prompt(ids, 0)
    attn, saved = rt.attn_prefill, dict(plan.prefill)
    o_names = [lw.o for lw in model.p.layers]
    asked, o_got = [], []

    def attention(q, k, v, start, plane=False):
        asked.append(plane)
        out = attn.fn(q, k, v, start)
        return Activation(None, out.to(torch.bfloat16)) if plane else out

    rt.attn_prefill = dataclasses.replace(attn, fn=attention, fuses=("plane",))
    try:
        got = {}
        for reads in (("plane",), ("f32", "plane")):
            asked.clear(), o_got.clear()
            plan.prefill.update({n: _plane_reader(saved[n], reads, o_got) for n in o_names})
            got[reads] = model.prompt(ids, 0)
            assert asked == o_got == [reads == ("plane",)] * len(o_names)
    finally:
        rt.attn_prefill = attn
        plan.prefill.clear()
        plan.prefill.update(saved)
    for y in got.values():
        assert ((y - plain).norm() / plain.norm()).item() < 1e-2
        assert torch.equal(y.argmax(-1), plain.argmax(-1))


def test_the_gate_up_kernel_writes_the_swiglu_when_down_reads_the_plane_alone(smollm):
    """A prefill gate|up candidate that fuses ``"swiglu_out"`` is asked for ``silu(g) * u`` exactly
    when the layer's down matmul reads only the plane; down then gets that Activation as it came (no
    SwiGLU producer, no f32 rows), otherwise the product and the core's SwiGLU as before. Either way
    the prompt's logits stay within bf16 rounding of the plain pass's."""
    model = smollm.model
    plan = model.rt.plan
    ids = torch.tensor(smollm.tok.encode("one two three four five six seven eight nine ten " * 3,
                                         add_special=True))
    plain = model.prompt(ids, 0)
    saved = dict(plan.prefill)
    layers = model.p.layers
    assert all(len(lw.ffn) == 1 for lw in layers)  # one [gate | up] weight a layer
    asked, down_got = [], []

    def gate_up(c):
        def fn(act, swiglu_out=False, **kw):
            asked.append(swiglu_out)
            y = c.fn(act, **kw)
            if not swiglu_out:
                return y
            g, u = y.float().chunk(2, dim=-1)
            return Activation(None, (torch.nn.functional.silu(g) * u).to(torch.bfloat16))
        return dataclasses.replace(c, fn=fn, fuses=tuple(c.fuses) + ("swiglu_out",))

    try:
        got = {}
        for reads in (("plane",), ("f32", "plane")):
            asked.clear(), down_got.clear()
            plan.prefill.update({lw.ffn[0]: gate_up(saved[lw.ffn[0]]) for lw in layers})
            plan.prefill.update({lw.down: _plane_reader(saved[lw.down], reads, down_got) for lw in layers})
            got[reads] = model.prompt(ids, 0)
            assert asked == down_got == [reads == ("plane",)] * len(layers)
    finally:
        plan.prefill.clear()
        plan.prefill.update(saved)
    for y in got.values():
        assert ((y - plain).norm() / plain.norm()).item() < 1e-2
        assert torch.equal(y.argmax(-1), plain.argmax(-1))
