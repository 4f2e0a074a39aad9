"""Write GGUF files byte by byte (``struct``), valid or not, and remember where every field lies.

``gguf.GGUFWriter`` refuses most broken inputs, so hostile files are written here: strings may be
``bytes`` (invalid UTF-8), a value may carry any type id, counts may lie. :class:`Crafted` records
each numeric field's offset and format under a label (``"n_kv"``, ``"count:tokenizer.ggml.tokens"``,
``"ne1:blk.0.attn_q.weight"``...) so a test or the fuzzer can overwrite it afterwards.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from minfer_core.quants import QUANTS
from minfer_core.synth import tiny_layout

_FMT = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
        VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}


@dataclass
class Val:
    """A metadata value with an explicit type; ``etype`` is the element type of an ARRAY."""

    vtype: int
    value: Any
    etype: int | None = None


@dataclass
class Raw:
    """A metadata value given as its type id and encoded bytes (e.g. arrays nested 10,000 deep)."""

    vtype: int
    data: bytes


def nested_arrays(depth: int) -> Raw:
    """An array of an array of ... (``depth`` levels) of an empty INT32 array."""
    return Raw(VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) * depth + struct.pack("<IQ", VT.INT32, 0))


def typed(v: Any) -> Val | Raw:
    """Python value -> GGUF type, as ``minfer_core.synth.write_layout`` chooses."""
    if isinstance(v, (Val, Raw)):
        return v
    if isinstance(v, bool):
        return Val(VT.BOOL, v)
    if isinstance(v, int):
        return Val(VT.UINT32 if 0 <= v < 2**32 else VT.INT64, v)
    if isinstance(v, float):
        return Val(VT.FLOAT32, v)
    if isinstance(v, (str, bytes)):
        return Val(VT.STRING, v)
    if isinstance(v, list):
        e = VT.STRING if v and isinstance(v[0], (str, bytes)) else VT.INT32
        return Val(VT.ARRAY, v, e)
    raise TypeError(v)


@dataclass
class Crafted:
    """A GGUF file being written; ``fields[label] = (offset, struct format)``."""

    buf: bytearray = field(default_factory=bytearray)
    fields: dict[str, tuple[int, str]] = field(default_factory=dict)

    def put(self, fmt: str, value, label: str | None = None) -> None:
        if label:
            self.fields[label] = (len(self.buf), fmt)
        self.buf += struct.pack(fmt, value)

    def string(self, s: str | bytes, label: str | None = None) -> None:
        raw = s.encode() if isinstance(s, str) else s
        self.put("<Q", len(raw), label)
        self.buf += raw

    def value(self, v: Val | Raw, label: str) -> None:
        if isinstance(v, Raw):
            self.buf += v.data
        elif v.vtype == VT.STRING:
            self.string(v.value, f"strlen:{label}")
        elif v.vtype == VT.ARRAY:
            self.put("<I", v.etype, f"etype:{label}")
            self.put("<Q", len(v.value), f"count:{label}")
            for i, item in enumerate(v.value):
                self.value(item if isinstance(item, Val) else Val(v.etype, item), f"{label}[{i}]")
        else:
            self.put(_FMT[VT(v.vtype)], v.value, f"value:{label}")

    def patch(self, label: str, value) -> None:
        """Overwrite the field ``label`` in place."""
        at, fmt = self.fields[label]
        struct.pack_into(fmt, self.buf, at, value)


def craft(metadata: dict[str, Any], tensors: list[tuple[str, QT, tuple[int, ...]]], *, version: int = 3,
          alignment: int = 32, offsets: dict[str, int] | None = None, data: bool = True) -> Crafted:
    """A GGUF file: header, tensor table (shapes in torch order, offsets packed in order unless given),
    then zero-filled tensor data (``data=False``: header only)."""
    c = Crafted()
    c.buf += b"GGUF"
    c.put("<I", version, "version")
    c.put("<Q", len(tensors), "n_tensors")
    c.put("<Q", len(metadata), "n_kv")
    for k, v in metadata.items():
        c.string(k, f"keylen:{k}")
        tv = typed(v)
        c.put("<I", tv.vtype, f"vtype:{k}")
        c.value(tv, k)
    pos, end = 0, 0
    for name, qt, shape in tensors:
        c.string(name, f"namelen:{name}")
        c.put("<I", len(shape), f"ndims:{name}")
        for j, d in enumerate(reversed(shape)):
            c.put("<Q", d, f"ne{j}:{name}")
        c.put("<I", int(qt), f"type:{name}")
        n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * QUANTS[qt].row_bytes(shape[-1])
        off = (offsets or {}).get(name, pos)
        c.put("<Q", off, f"offset:{name}")
        pos = -(-(off + n_bytes) // alignment) * alignment
        end = max(end, off + n_bytes)
    if data:
        c.buf += bytes(-len(c.buf) % alignment)
        c.buf += bytes(end)
    return c


def small_model(arch: str = "qwen2", **kw) -> tuple[dict[str, Any], list[tuple[str, QT, tuple[int, ...]]]]:
    """A valid model small enough to write hundreds of times: one block, 64 wide, 2 heads of 32."""
    opts = dict(n_layers=1, n_embd=64, n_heads=2, n_kv_heads=1, n_ff=64) | kw
    return tiny_layout(arch, QT.Q8_0, **opts)
