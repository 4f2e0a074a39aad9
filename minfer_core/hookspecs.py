"""Hook specifications: the public API for minfer kernel plugins.

A plugin is a module (or object) with functions marked ``@hookimpl`` whose names match the
specs below; it is found through the entry-point group ``minfer.plugins``. Every hook runs at
*load time* only. After loading, the core has built a dispatch table (tensor -> kernel) and a
fuse mode, and forward passes call neither hooks nor read environment variables.

Ordering is the policy's (``configs/gates.yaml``), not pluggy's: the core calls every plugin,
collects all the candidates they offer and ranks them by the policy order for that class of
work. A plugin therefore never needs ``tryfirst``/``trylast``.

Objects passed to hooks are defined in :mod:`minfer_core.weights`.
"""

from __future__ import annotations

import pluggy

PROJECT = "minfer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------
# Load: gates, hardware and weights
# ---------------------------------------------------------------------------------------------


@hookspec
def minfer_gates():
    """Declare this plugin's gates: a list of :class:`~minfer_core.weights.Gate` (or ``None``).

    Called once per load on every registered plugin, applicable here or not (``minfer gates``
    lists them all). The core resolves each gate once (environment over the policy's
    ``gates.<plugin>.<NAME>`` over the declared default) and hands the values to every hook as
    ``ctx.gates``; a plugin reads its gates there, never from the environment. Names must be
    unique across plugins; ``labels`` are the proof a gate is alive (docs/plugins.md, "Gates").
    """



@hookspec
def minfer_applicable(ctx):
    """Say whether this plugin can run on this machine at all.

    Called once per load, before any weight is registered. ``ctx`` is the
    :class:`~minfer_core.weights.LoadContext` (device, compute capability, resolved gates).
    Return ``None`` if it can run, or a short reason string if it cannot (e.g. ``"needs a CUDA
    device with compute capability >= 8.0"``). A plugin that is not applicable is asked nothing
    else; an explicit ``--backend`` naming it is then an error carrying this reason.
    """


@hookspec
def minfer_register_weight(weight, ctx):
    """Prepare a matmul weight this plugin may later serve.

    Called once per 2-D matmul weight (after QKV and gate|up fusion), in file order, before the
    dispatch table is built. ``weight`` is a :class:`~minfer_core.weights.Weight`; a plugin may
    build planes or caches and store them in ``weight.planes[<key>]`` (keys are prefixed with the
    plugin name). A plugin that replaces the raw bytes entirely may call
    ``weight.drop_raw()`` only when ``ctx`` says no other chosen kernel reads them.
    Return value is ignored. Not called when the core only plans (``minfer gates -m``, where
    ``weight.raw`` is None): what a plugin offers must not depend on this hook having run.
    """


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------


@hookspec
def minfer_matmul_candidates(weight, phase, ctx):
    """Offer kernels for ``y = x @ weight.T``.

    ``phase`` is ``"prefill"`` (16 or more rows of activations) or ``"decode"`` (fewer rows;
    in practice a single token). Return a list of :class:`~minfer_core.weights.Candidate`
    (possibly empty) or ``None`` for "nothing to offer". The core ranks every plugin's candidates
    by the policy's ordering for that phase and keeps the first; the reference backend is always
    the last resort. A candidate whose ``reads`` contains ``"plane"`` consumes the activation
    plane (prefill only); the fuse mode 2 is kept only when every chosen prefill kernel does. A
    candidate whose ``fuses`` holds ``"residual"`` adds the block's residual itself
    (``fn(x, residual=r)``, and may write the sum over ``r``, which the core no longer reads); the
    core adds it otherwise. A prefill candidate whose ``fuses`` holds ``"bf16_out"`` may return a
    product that feeds only the SwiGLU in bf16 (``fn(x, out_bf16=True)``), and one whose ``fuses``
    holds ``"swiglu_out"`` the SwiGLU's output itself (``Candidate.fuses``).
    """


@hookspec
def minfer_matmul_group_candidates(weights, phase, ctx):
    """Offer one kernel for several weights that multiply the same input and that the loader could not
    fuse into one weight (a layer's q|k and v where their quant types differ: ``loader.input_groups``).

    ``weights``: the group in model order; ``phase``: ``"decode"`` (the only phase asked). A candidate's
    ``fn(x (M, K) f32, norm=None) -> [y_0, y_1, ...]`` returns ``y_i = f(x) @ weights[i].T + bias_i``
    float32 ``(M, N_i)`` (views of one buffer are fine), ``f`` the RMSNorm ``norm=(w, eps)``, which
    the core passes only when ``fuses`` holds ``"rmsnorm"`` (else it normalizes ``x`` first). Ranked
    by the policy's order for the phase; the core runs the group in place of the members' own kernels
    only where its plugin is the plugin of every member's chosen kernel, so the policy and
    ``--backend`` decide as they do for single weights. Return a list of Candidates or ``None``.
    """


@hookspec
def minfer_batch_matmul_candidates(weight, ctx):
    """Offer kernels for the batched engine's ``y = [residual +] f(x) @ weight.T`` over all of a
    step's rows at generated positions (and the output head's rows) at once, any number of them
    (1 .. 256 and more); prompt rows run on the prefill kernels over prompt tiles
    (``Candidate.tiled``).

    A candidate's ``fn(x (M, K) f32, residual=None, norm=None, swiglu=False) -> (M, N) f32`` must
    give each row the same bits whatever ``M`` is and whatever the other rows hold (the batched
    engine's batch invariance rests on it); ``fuses`` names the keywords it applies itself, as for
    decode (``norm=(w, eps)``: RMSNorm of x first; ``swiglu``: x is ``[g | u]``). Optional: a weight
    without one runs on the prefill/decode kernels over fixed tiles of rows (``--row-tile``). Ranked
    by the policy's ``decode`` order. Return a list of Candidates or ``None``.
    """


@hookspec
def minfer_rmsnorm_candidates(ctx):
    """Offer a fused RMSNorm producer for prefill: ``fn(x, w, eps) -> Activation``.

    Consulted only when the negotiated fuse mode (``ctx.fuse_mode``) is 1 or 2. The producer writes
    the activation plane the GEMMs read, and the f32 rows ``(M, E)`` too unless the mode is 2.
    Ranked by the policy's ``producer`` order. Return a list of Candidates or ``None``.
    """


@hookspec
def minfer_swiglu_candidates(ctx):
    """Offer a fused SwiGLU producer for prefill: ``fn(gu) -> Activation`` with ``gu = [gate | up]``
    of shape ``(M, 2F)``, float32 or bf16 (a gate|up matmul that fuses ``"bf16_out"``). Consulted
    and written as :func:`minfer_rmsnorm_candidates` says."""


@hookspec
def minfer_prepass_candidates(ctx):
    """Offer the activation prepass: ``fn(x) -> Activation`` writing both the f32 rows and the plane.

    Consulted whenever a chosen prefill kernel reads the activation plane (its ``reads`` holds
    ``"plane"``), whatever the fuse mode; with no offer the core converts with torch
    (``ref.prepass``). Ranked by the policy's ``producer`` order. Return a list of Candidates or
    ``None``.
    """


@hookspec
def minfer_decode_rmsnorm_candidates(ctx):
    """Offer the single-token RMSNorm: ``fn(x, w, eps) -> f32 (M, E)``. Ranked by the policy's
    ``decode`` order; it must not depend on any prefill gate. The reference backend offers one."""


@hookspec
def minfer_decode_rope_kv_candidates(ctx):
    """Offer the single-token RoPE + KV write:
    ``fn(q, k, v, cos, sin, k_cache, v_cache, pos, neox) -> q (H, D)`` rotates q ``(H*D,)`` and k
    ``(Hkv*D,)`` and writes k and v into row ``pos`` (a ``(1,)`` device tensor, never read on the
    host) of the layer's caches ``(n_ctx, Hkv, D)``. Ranked by the policy's ``decode`` order; no gate.
    The reference backend offers one."""


@hookspec
def minfer_argmax_candidates(ctx):
    """Offer the greedy pick: ``fn(logits) -> (R,) int64``, each row of float ``logits (R, V)``'s
    first index of its largest value, exactly ``torch.argmax(logits, dim=-1)`` (a NaN counts as the
    largest); a row's pick may read that row alone. Ranked by the policy's ``decode`` order; no
    gate. The reference backend offers torch's."""


@hookspec
def minfer_embed_candidates(ctx):
    """Offer the token embedding lookup: ``fn(table, qtype, n_cols, tokens) -> f32 (T, n_cols)``, rows
    ``tokens`` ((T,) int64 on the device, never read on the host) of the GGUF embedding table's raw
    blocks ``table`` (vocab, row_bytes) uint8 of type ``qtype``, dequantized as gguf does (float32
    arithmetic; any type the reference dequantizes). Every pass embeds through it. Ranked by the
    policy's ``decode`` order; no gate. The reference backend offers the core's dequantizer."""


@hookspec
def minfer_prefill_rope_kv_candidates(ctx):
    """Offer the prompt's RoPE + KV write:
    ``fn(q, k, v, cos, sin, k_cache, v_cache, start, neox) -> q (T, H, D)`` rotates q ``(T, H, D)``
    and k ``(T, Hkv, D)`` (heads contiguous, rows possibly strided) and writes k and v into cache
    rows ``start .. start + T - 1``; ``start`` may also be a ``(T,)`` int64 device tensor, the
    cache row of each token (the batched engine's rows), with cos/sin holding each row's. Ranked by
    the policy's ``prefill`` order; no gate. The reference backend offers one."""


@hookspec
def minfer_fuse_proposal(weights, readers, ctx):
    """Propose the producer fuse mode, i.e. which activation formats this plugin's fused producers
    write: mode 1 the plane and the f32 rows, mode 2 only the plane (0: plain producers).

    Called once per load on every registered plugin, applicable here or not (the answer is a
    statement about the model, shown by ``minfer gates -m``). A plugin that offers fused producers
    returns ``(mode, reason)``: the highest mode its gates, the ``weights`` (a weight its consumers
    cannot read from the plane forbids mode 2) and ``readers`` (debug readers of f32 activations)
    allow, and why it is lower than asked (``""`` if not). Others return ``None``. The highest
    proposal wins; where its plugin cannot run here the mode is 0. The core then lowers it to what
    the chosen prefill consumers read (mode 2 only if every one reads the plane) and asks
    :func:`minfer_fuse_mode`.
    """


@hookspec
def minfer_fuse_mode(model, requested, ctx):
    """Veto or lower the negotiated fuse mode for this model.

    Called once after the consumers are chosen, with ``requested`` (1 or 2; not called when 0), on
    applicable plugins. Return ``None`` to accept it, or a lower ``(mode, reason)``. The lowest
    mode any plugin returns wins; a higher one is ignored. ``model`` is whatever the caller of
    ``build_plan`` passed (may be None).
    """


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------


@hookspec
def minfer_wrap_decode_step(step, ctx):
    """Wrap the single-token decode step, e.g. to capture and replay it as a CUDA graph.

    ``step`` is a :class:`~minfer_core.weights.DecodeStep`: ``step(token_ids, positions)``
    returns logits and touches only static buffers; or a solo engine's greedy step
    (:mod:`minfer_core.greedy_chain`), ``step()`` with no inputs, returning its pick. Return a
    callable with the same signature, or ``None`` to leave it alone. The candidate ranked first
    by the policy's ``decode_step`` ordering is used; the model itself knows nothing about graphs.
    """


@hookspec
def minfer_wrap_prefill_step(step, ctx):
    """Wrap the whole-prompt prefill step, e.g. to capture it as a CUDA graph per prompt length.

    ``step(token_ids, last)`` runs ``token_ids`` ``(T,)`` from position 0 (an empty cache) and
    returns the logits ``(1, vocab)`` of row ``last`` (a ``(1,)`` int64 device tensor, never read
    on the host). The core pads prompts to a few bucket lengths before calling it (causal
    attention keeps the padding out of the real rows), so there are few distinct shapes. Running
    the step twice on the same inputs gives the same result. Return a callable with the same
    signature, or ``None``. The plugin ranked first by the policy's ``prefill_step`` ordering is
    used; with none, prompts run through the plain forward, unpadded.
    """


@hookspec
def minfer_wrap_batch_step(step, padding, ctx):
    """Wrap the batched engine's decode-only step, e.g. to capture a CUDA graph per entry count.

    Called once when a batched engine (``minfer serve``, ``bench --batch``) is built on a loaded
    model. ``step(inputs)`` maps ``inputs`` ``(E, width)`` int64 on the device (one packed entry
    per sequence, E one of a few bucket sizes) to logits ``(E, vocab)``, reading nothing on the
    host. ``padding`` is one padding entry row, int64 ``(width,)`` on the device: a step of padding
    entries only writes and reads a scratch block, so it may be run at any time (to warm up or
    capture) without touching a real sequence. The caller reads the returned logits before the
    next call, so they may be a static buffer the next call overwrites. Return a callable with the
    same signature, or ``None`` to leave it alone. The plugin ranked first by the policy's
    ``batch_step`` ordering is used; with none, every step runs eagerly.
    """


@hookspec
def minfer_attention_candidates(phase, ctx):
    """Offer an attention kernel.

    ``phase`` is ``"decode"`` (one new token reading the whole KV cache) or ``"prefill"``.
    Decode contract: ``fn(q, k_cache, v_cache, n_valid) -> out`` with ``q`` ``(n_heads, head_dim)``,
    caches ``(max_ctx, n_kv_heads, head_dim)`` of one layer, ``n_valid`` a 0-d int32 device tensor
    (positions ``0 .. n_valid-1`` are valid; it must not be read on the host, so the call can be
    captured in a CUDA graph) and ``out`` ``(n_heads * head_dim,)`` float32. A candidate whose
    ``fuses`` holds ``"rope_kv"`` also takes ``rope=(k, v, cos, sin, neox)`` (the decode RoPE op's
    arguments; ``q`` then unrotated, ``(n_heads * head_dim,)``), rotates and writes row ``n_valid -
    1`` itself: the step then launches no RoPE op.
    Prefill contract: ``fn(q, k, v, start) -> out`` with ``q`` ``(T, n_heads, head_dim)``,
    ``k``/``v`` ``(start + T, n_kv_heads, head_dim)`` (cached then new), causal, ``out``
    ``(T, n_heads * head_dim)`` float32; a candidate whose ``fuses`` holds ``"plane"`` returns, for
    ``fn(..., plane=True)``, an :class:`~minfer_core.weights.Activation` of the bf16 plane alone
    (asked when the layer's o matmul reads nothing else).
    ``"paged_decode"`` (the batched engine: one query row per entry, each over its own sequence in
    a paged pool): ``fn(q, k_pages, v_pages, block_tables, seq_lens) -> out`` with ``q`` ``(N,
    n_heads, head_dim)``, pages ``(n_blocks, page, n_kv_heads, head_dim)`` of one layer,
    ``block_tables`` ``(N, max_blocks)`` int32, ``seq_lens`` ``(N,)`` int32 device tensors (never
    read on the host on a GPU, so a step can be captured) and ``out`` ``(N, n_heads * head_dim)``
    float32. An entry's result must not depend on the other entries (batch invariance). Such an
    ``fn`` may also offer ``fn.for_engine(parallel) -> fn`` (optional): the callable a batched
    engine of at most ``parallel`` sequences uses for its whole life, e.g. tuned for that load; the
    same contract holds for it.
    ``"paged_prefill"`` (the batched engine's prompt rows): ``fn(q, k_pages, v_pages, calls,
    block_tables, out, max_rows) -> out`` with ``q`` ``(T, n_heads, head_dim)``, pages as above,
    ``calls`` ``(C, 4)`` int32 (first row, row count, first position, row of ``block_tables``),
    ``block_tables`` ``(S, max_blocks)`` int32, ``out`` ``(T, n_heads * head_dim)`` float32 and
    ``max_rows`` (a host int) the most rows of any call. Row ``i`` of a call is at position ``first +
    i`` and sees its sequence's keys up to itself; ``fn`` writes the calls' rows of ``out`` and no
    other. A call's result must not depend on the other calls.
    Return a list of Candidates or ``None`` (a phase the plugin does not know: ``None``).
    """
