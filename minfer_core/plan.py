"""What build_plan resolves, once per load: the kernels, the fuse choice, the wrapped steps."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from .weights import Candidate

PHASES = ("prefill", "decode")


@dataclass(kw_only=True)
class FuseChoice:
    """The negotiated producer fuse mode (0, 1, 2) and why it is what it is."""

    mode: int = 0
    reason: str = ""
    model_mode: int = 0  # what the model allows, the proposing plugin assumed able to run
    model_reason: str = ""
    proposer: Optional[str] = None  # the plugin whose fused producers the mode is for
    off_reason: str = ""  # "<plugin> cannot run here: <why>" when the proposer cannot


@dataclass(kw_only=True)
class Plan:
    """What the forward runs. Keyword fields only, in groups."""

    # -- kernels: one candidate per (phase, tensor), producers, attention, fused single ops
    prefill: dict[str, Candidate] = field(default_factory=dict)
    decode: dict[str, Candidate] = field(default_factory=dict)
    batch: dict[str, Candidate] = field(default_factory=dict)  # row-invariant kernels of the batched step, if any
    decode_groups: dict[tuple[str, ...], Candidate] = field(default_factory=dict)  # weights sharing an input, one kernel
    producers: dict[str, Candidate] = field(default_factory=dict)  # 'rmsnorm', 'swiglu' (mode > 0), 'prepass'
    attention: dict[str, Candidate] = field(default_factory=dict)  # 'prefill', 'decode', 'paged_decode'
    decode_ops: dict[str, Candidate] = field(default_factory=dict)  # 'decode_rmsnorm', 'decode_rope_kv', 'argmax', 'embed'
    prefill_ops: dict[str, Candidate] = field(default_factory=dict)  # 'prefill_rope_kv'
    # -- activations between producers and consumers
    fuse: FuseChoice = field(default_factory=FuseChoice)
    a_transpose: bool = False  # a chosen prefill consumer reads the activation plane: producers write it
    # -- whole steps a plugin wraps
    decode_step: Optional[Candidate] = None
    prefill_step: Optional[Candidate] = None
    batch_step: Optional[Candidate] = None  # the batched engine's decode-only step
    decode_step_order: list[str] = field(default_factory=list)
    prefill_step_order: list[str] = field(default_factory=list)
    batch_step_order: list[str] = field(default_factory=list)
    # -- facts of this load
    applicable: dict[str, Optional[str]] = field(default_factory=dict)  # plugin -> None or why not
    tensors: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (class, qtype)
    released_raw: int = 0  # bytes of raw GGUF blocks released because planes replace them
    notes: list[str] = field(default_factory=list)

    @property
    def fuse_mode(self) -> int:
        return self.fuse.mode

    @property
    def fuse_reason(self) -> str:
        return self.fuse.reason

    @property
    def model_fuse_mode(self) -> int:
        return self.fuse.model_mode

    @property
    def model_fuse_reason(self) -> str:
        return self.fuse.model_reason

    def labels_by_class(self) -> dict:
        """Chosen labels grouped by tensor class and quant type (for ``minfer gates -m``)."""
        out: dict[str, Any] = {}
        for phase in PHASES + ("batch",):
            table = getattr(self, phase)
            rows = Counter((*self.tensors[n], c.label, c.plugin) for n, c in table.items())
            out[phase] = [{"class": k[0], "qtype": k[1], "label": k[2], "plugin": k[3], "tensors": n}
                          for k, n in sorted(rows.items())]
        groups = Counter((" + ".join(self.tensors[n][0] for n in names), c.label, c.plugin)
                         for names, c in self.decode_groups.items())
        out["decode_groups"] = [{"classes": k[0], "label": k[1], "plugin": k[2], "groups": n}
                                for k, n in sorted(groups.items())]
        out["producers"] = {k: c.label for k, c in self.producers.items()}
        out["attention"] = {k: c.label for k, c in self.attention.items()}
        out["decode_ops"] = {k: c.label for k, c in self.decode_ops.items()}
        out["prefill_ops"] = {k: c.label for k, c in self.prefill_ops.items()}
        out["decode_step"] = self.decode_step.label if self.decode_step else None
        out["prefill_step"] = self.prefill_step.label if self.prefill_step else None
        out["batch_step"] = self.batch_step.label if self.batch_step else None
        return out
