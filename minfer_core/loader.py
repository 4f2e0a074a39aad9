"""From a GGUF file to the objects the engine runs: matmul Weights (QKV and gate|up fused) and
the small f32 tensors (norms), on the compute device."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from tqdm import tqdm

from .model_config import ModelConfig
from .gguf_file import GGUFFile, ModelFileError, TensorEntry
from .weights import Weight


@dataclass
class LayerNames:
    """Names of one block's matmul weights after fusion (``qkv``, ``qk``/``v`` or ``q``/``k``/``v``; ``gate_up``
    or both)."""

    attn: tuple[str, ...]
    o: str
    ffn: tuple[str, ...]
    down: str


@dataclass
class ModelParams:
    """Everything but the matmul weights: norms, the embedding table's raw rows, and the names."""

    tok_embd: torch.Tensor  # uint8 (vocab, row_bytes) raw blocks, dequantized per lookup
    tok_embd_type: QT
    attn_norm: list[torch.Tensor]
    ffn_norm: list[torch.Tensor]
    out_norm: torch.Tensor
    layers: list[LayerNames]


def _fusable(entries: list[TensorEntry]) -> bool:
    return len({e.qtype for e in entries}) == 1 and len({e.shape[1] for e in entries}) == 1


def _plan_weights(f: GGUFFile, cfg: ModelConfig):
    """Yield (name, role, [entries], [bias entries or None]) in model order, fused where types agree: q, k
    and v as one ``qkv`` weight, or q and k as one ``qk`` weight where only v's type differs (Q4_K_M gives
    some layers a q6_K v)."""
    t = f.tensors
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        qkv = [t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"]]
        biases = [t.get(p + f"attn_{x}.bias") for x in "qkv"]
        if _fusable(qkv):
            yield p + "attn_qkv", "qkv", qkv, biases
        elif _fusable(qkv[:2]):
            yield p + "attn_qk", "qk", qkv[:2], biases[:2]
            yield p + "attn_v", "v", qkv[2:], biases[2:]
        else:
            for x, e, b in zip("qkv", qkv, biases):
                yield p + f"attn_{x}", x, [e], [b]
        yield p + "attn_output", "o", [t[p + "attn_output.weight"]], [t.get(p + "attn_output.bias")]
        gu = [t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"]]
        if _fusable(gu):
            yield p + "ffn_gate_up", "gate_up", gu, [None, None]
        else:
            yield p + "ffn_gate", "gate", [gu[0]], [None]
            yield p + "ffn_up", "up", [gu[1]], [None]
        yield p + "ffn_down", "down", [t[p + "ffn_down.weight"]], [None]
    out = t.get("output.weight") or t["token_embd.weight"]
    yield "output", "output", [out], [None]


#: Roles of the weights that multiply a layer's attention input, and its ffn input, when not fused into one
ATTN_INPUTS, FFN_INPUTS = ("qk", "q", "k", "v"), ("gate", "up")


def input_groups(weights: list[Weight]) -> list[list[Weight]]:
    """Per layer, the weights left unfused that multiply one input (e.g. ``qk`` and ``v``), in model order."""
    groups: dict[tuple[str, bool], list[Weight]] = {}
    for w in weights:
        if w.name.startswith("blk.") and w.role in ATTN_INPUTS + FFN_INPUTS:
            groups.setdefault((w.name.split(".")[1], w.role in ATTN_INPUTS), []).append(w)
    return [g for g in groups.values() if len(g) > 1]


def _to_tensor(e: TensorEntry, device: torch.device) -> torch.Tensor:
    arr = np.ascontiguousarray(e.data)
    if e.qtype == QT.F32:
        return torch.from_numpy(arr.view(np.float32).reshape(e.shape)).to(device)
    return torch.from_numpy(arr.view(np.uint8).reshape(e.shape[0], -1)).to(device)


def _raw_rows(e: TensorEntry, device: torch.device) -> torch.Tensor:
    """A matmul weight's raw bytes as uint8 (rows, row_bytes); F32/F16/BF16 rows are bytes too."""
    arr = np.ascontiguousarray(e.data).view(np.uint8).reshape(e.shape[0], -1)
    return torch.from_numpy(arr).to(device)


def weights_from_file(f: GGUFFile, cfg: ModelConfig, device: torch.device | None = None,
                      progress: bool = False) -> list[Weight]:
    """The matmul weights in model order. With ``device=None`` no data is read (``raw`` is None).
    ``progress`` shows a bar (stderr) while the bytes move to the device."""
    weights = []
    plan = list(_plan_weights(f, cfg))
    total = sum(e.n_bytes for _, _, entries, _ in plan for e in entries)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="load", file=sys.stderr, leave=False,
               disable=not progress or device is None)
    for name, role, entries, biases in plan:
        bar.update(sum(e.n_bytes for e in entries))
        n_out = sum(e.shape[0] for e in entries)
        raw = bias = None
        if device is not None:
            parts = [_raw_rows(e, device) for e in entries]
            raw = parts[0] if len(parts) == 1 else torch.cat(parts, 0)
            if any(b is not None for b in biases):
                bias = torch.cat([
                    _to_tensor(b, device) if b is not None else torch.zeros(e.shape[0], device=device)
                    for e, b in zip(entries, biases)
                ])
        weights.append(Weight(name, entries[0].qtype, (n_out, entries[0].shape[1]), raw, role, bias))
    bar.close()
    return weights


def load_params(f: GGUFFile, cfg: ModelConfig, weights: list[Weight], device: torch.device) -> ModelParams:
    """Norms and the embedding table on ``device``; layer names from the fused weight list."""
    t = f.tensors
    layers: list[LayerNames] = []
    by_layer: dict[int, dict[str, str]] = {}
    for w in weights:
        if w.name.startswith("blk."):
            by_layer.setdefault(int(w.name.split(".")[1]), {})[w.role] = w.name
    for i in range(cfg.n_layers):
        d = by_layer[i]
        attn = (d["qkv"],) if "qkv" in d else (d["qk"], d["v"]) if "qk" in d else (d["q"], d["k"], d["v"])
        ffn = (d["gate_up"],) if "gate_up" in d else (d["gate"], d["up"])
        layers.append(LayerNames(attn, d["o"], ffn, d["down"]))

    def vec(name: str) -> torch.Tensor:
        e = t[name]
        if e.qtype != QT.F32:
            raise ModelFileError(f.path, f"tensor {name!r} has type {e.qtype.name}, expected F32")
        return _to_tensor(e, device)

    emb = t["token_embd.weight"]
    return ModelParams(
        tok_embd=_raw_rows(emb, device),
        tok_embd_type=emb.qtype,
        attn_norm=[vec(f"blk.{i}.attn_norm.weight") for i in range(cfg.n_layers)],
        ffn_norm=[vec(f"blk.{i}.ffn_norm.weight") for i in range(cfg.n_layers)],
        out_norm=vec("output_norm.weight"),
        layers=layers,
    )
