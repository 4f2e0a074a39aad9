"""Objects passed between the core and plugins at load time (see :mod:`minfer_core.hookspecs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch


@dataclass
class Weight:
    """One 2-D matmul weight: ``y = x @ W.T`` with ``W`` of shape ``(n_out, n_in)``.

    ``raw`` holds the GGUF blocks as a uint8 tensor of shape ``(n_out, bytes_per_row)`` on the
    compute device (rows are independent, so fused weights are concatenations of rows).
    ``qtype`` is a :class:`gguf.GGMLQuantizationType`. ``bias`` is an optional f32 vector.
    ``role`` names the job in the block: ``qkv``, ``qk``, ``q``, ``k``, ``v``, ``o``, ``gate_up``,
    ``gate``, ``up``, ``down``, ``output``.
    """

    name: str
    qtype: Any
    shape: tuple[int, int]
    raw: Optional[torch.Tensor]
    role: str = ""
    bias: Optional[torch.Tensor] = None
    planes: dict[str, Any] = field(default_factory=dict)

    @property
    def n_out(self) -> int:
        return self.shape[0]

    @property
    def n_in(self) -> int:
        return self.shape[1]

    def drop_raw(self) -> None:
        """Release the raw GGUF bytes (a plane now holds everything the chosen kernels read)."""
        self.raw = None


@dataclass
class Activation:
    """An activation as its producer wrote it.

    ``f32``: the float32 rows ``(M, K)`` (absent under fuse mode 2).
    ``plane``: the layout the plane-family GEMMs read (bf16 ``(M, K)``), written once per
    producer when a chosen prefill consumer reads it (a ``Candidate`` whose ``reads`` holds
    ``"plane"``); absent otherwise.
    ``forms``: other layouts of the same rows (or of ``silu(g) * u`` of them), by name, that the kernel
    producing them wrote on the way (the decode attention's output in a plugin's quantized layout, the
    gate|up GEMV's SwiGLU). The core hands a decode matmul ``forms=`` the ones its candidate's ``reads``
    names; every other consumer reads ``f32``.
    """

    f32: Optional[torch.Tensor]
    plane: Optional[torch.Tensor] = None
    forms: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        t = self.f32 if self.f32 is not None else self.plane
        return t.shape[0]

    def __getitem__(self, rows: slice) -> "Activation":
        return Activation(None if self.f32 is None else self.f32[rows],
                          None if self.plane is None else self.plane[rows])


@dataclass
class Candidate:
    """A kernel offered by a plugin.

    ``plugin``: the offering plugin's name (the policy orders by it). ``label``: the dispatch label
    recorded each time the kernel runs (e.g. ``example.q8_0``). ``fn``: the callable; for matmuls
    ``fn(act: Activation | Tensor) -> Tensor``, for producers see the core's producer contract.
    ``gate``: the gate this candidate depends on, if any (for ``minfer gates``).
    ``fuses``: what ``fn`` also does when asked through keywords, so the step needs fewer
    launches: ``"residual"``: ``fn(x, residual=r)`` returns ``r + x @ W.T (+ b)`` (decode and
    prefill matmuls; ``r`` float32 ``(M, N)``, contiguous, given up by the caller: ``fn`` may write
    the sum over it); (decode matmuls) ``"rmsnorm"``: ``fn(h,
    norm=(w, eps))`` multiplies ``rmsnorm(h) * w`` by the weight; ``"swiglu"``: ``fn(gu,
    swiglu=True)`` uses ``silu(g) * u`` of the halves of ``gu``; ``"glu_out"`` (a ``[gate | up]``
    weight): ``fn(x, glu_out=True)`` returns an :class:`Activation`, ``f32`` the product and ``forms``
    also holding ``silu(g) * u`` of it in the plugin's layouts (asked when the product feeds only the
    SwiGLU; the down projection's candidate gets them with ``swiglu=True``); (prefill matmuls) ``"bf16_out"``:
    ``fn(act, out_bf16=True)`` may return its product rounded to bf16 (asked only of products that
    feed the SwiGLU producer alone, which reads either dtype: half the bytes written and read back);
    ``"swiglu_out"`` (a ``[gate | up]`` weight): ``fn(act, out_bf16=True, swiglu_out=True)`` may return,
    in place of the product, an :class:`Activation` of ``silu(g) * u`` of its halves as the SwiGLU
    producer writes it under fuse mode 2 (the bf16 plane alone; asked only when the down projection's
    kernel reads nothing else);
    (prefill attention) ``"plane"``: ``fn(q, k, v, start, plane=True)`` returns the output as an
    :class:`Activation` of the bf16 plane alone, for an o matmul that reads only the plane;
    (decode attention) ``"rope_kv"``: ``fn(q, k_cache, v_cache, n_valid, rope=(k, v, cos, sin,
    neox))`` takes ``q`` unrotated and does the decode RoPE op's work itself (rotates q and k, writes
    k and v into the caches' row ``n_valid - 1``) before attending.
    The core does whatever a candidate does not fuse itself.
    ``reads`` (prefill matmuls): the layouts of the activation ``fn`` reads (``"f32"``, ``"plane"``);
    (decode matmuls): the names of :attr:`Activation.forms` that ``fn(x, forms={name: data})`` can
    take in place of quantizing ``x`` itself (also with ``swiglu=True``: a form's name says whether it
    holds ``x`` or ``silu(g) * u`` of it).
    ``reads_raw``: whether ``fn`` reads ``weight.raw`` when it runs. When none of a weight's chosen
    kernels does, the core releases the raw bytes after planning (planes replace them).
    ``small_tiles`` (prefill matmuls): the kernel's time keeps falling with the row count down to 16
    rows (it expands no weight per call), so a batched engine of few sequences may run it over
    16-row tiles.
    ``tiled`` (prefill matmuls, optional): ``tiled(act, tile)`` multiplies ``act`` (a whole number of
    ``tile``-row tiles) one tile at a time with one kernel configuration for every tile, sharing
    whatever the weight's expansion costs, so that a row's bits depend on that row and ``tile``
    alone. Without it the core calls ``fn`` once per tile.
    """

    plugin: str
    label: str
    fn: Callable[..., Any]
    gate: Optional[str] = None
    reads: tuple[str, ...] = ("f32",)
    fuses: tuple[str, ...] = ()
    reads_raw: bool = True
    small_tiles: bool = False
    tiled: Optional[Callable[..., Any]] = None


@dataclass
class LoadContext:
    """What a plugin may know at load time. Built once; holds no environment reads after that."""

    device: torch.device
    compute_capability: Optional[tuple[int, int]]
    gates: dict[str, Any]
    fuse_mode: int = 0
    trace: bool = False
    #: plugin -> None (it can run here) or why not; filled before registration. A plugin whose
    #: fallback depends on another plugin (a cache built where that one cannot run) reads it.
    applicable: dict[str, Optional[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def gate_on(self, name: str) -> bool:
        """The resolved value of an on/off gate (never reads the environment)."""
        return bool(self.gates[name])


@dataclass
class Gate:
    """A switch or a mode a plugin declares (hook ``minfer_gates``); its value comes from the
    environment variable ``name``, else the policy's ``gates.<plugin>.<name>``, else ``default``.

    ``kind`` is ``"switch"`` when ``modes`` is empty: unset or any value but ``"0"`` is ON, ``"0"``
    is OFF, and ``default`` is a bool. Otherwise ``"mode"``: ``modes`` maps each integer mode (0
    included: what "off" means) to what it does; a variable equal to ``str(mode)`` selects that
    mode and any other value selects 0; ``default`` is one of the modes.
    ``description``: what ON means (a switch) or what the gate governs (a mode); ``off``: what
    ``"0"`` does (a switch). ``labels``: dispatch-label prefixes that prove the gate alive (they
    appear under ``--trace-dispatch`` when it is on and vanish at ``"0"``); empty for a gate that
    changes how a kernel runs, not which one. ``group``: the heading ``minfer gates`` lists it
    under (``gate``, ``plane_builder``, ``decode`` ...). ``plugin`` is filled in by the core.
    """

    name: str
    default: Union[bool, int]
    description: str
    off: str = ""
    modes: dict[int, str] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    group: str = "gate"
    plugin: str = ""

    @property
    def kind(self) -> str:
        return "mode" if self.modes else "switch"

    def parse(self, raw: Optional[str]) -> Union[bool, int]:
        """The value a raw variable (``None``: unset) gives, with ``default`` for unset."""
        if raw is None:
            return self.default
        if self.kind == "switch":
            return raw != "0"
        return {str(m): m for m in self.modes if m}.get(raw, 0)

    def effect(self, value: Union[bool, int]) -> str:
        """What this value of the gate does."""
        if self.kind == "mode":
            return self.modes[int(value)]
        return self.description if value else self.off


DecodeStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
