"""Parse a GGUF header (magic, metadata, tensor table) from a bytes-like buffer, distrusting it.

Every count and length the file states is checked against the bytes that are left before anything
is allocated for it, so a hostile header costs at most time and memory linear in the file size
(and metadata arrays are capped in all). Every problem ends in one :class:`ModelFileError`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from minfer_core.errors import UserError
from minfer_core.quants import QUANTS

DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4  # arrays of arrays (llama.cpp reads none)
MAX_ARRAY_VALUES = 1 << 25  # all metadata array elements together (real vocabularies: < 1M)
MAX_TENSOR_VALUES = 1 << 60  # elements of one tensor (int64 sizes with room to spare)
# Smallest encodings: key length + type + 1-byte value; name length + n_dims + 1 dim + type + offset.
MIN_KV_BYTES, MIN_TENSOR_INFO_BYTES = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8


def shown(text: Any, limit: int = 60) -> str:
    """``repr`` of a value from the file, cut to ``limit`` characters (error messages stay one line)."""
    r = repr(text)
    return r if len(r) <= limit else r[:limit - 3] + "..."


class ModelFileError(UserError):
    """A model file that cannot be used. ``str(e) == "<path>: <problem>"``.

    Built as ``ModelFileError(path, problem)`` (or with one ready-made message)."""

    def __init__(self, path: str | Path, problem: str | None = None):
        self.path, self.problem = str(path), problem
        where = self.path if self.path.isprintable() else repr(self.path)
        super().__init__(where if problem is None else f"{where}: {problem}")


@dataclass
class TensorInfo:
    """One entry of the tensor table. ``ne`` is ggml order (fastest dimension first)."""

    name: str
    qtype: QT
    ne: tuple[int, ...]
    offset: int  # relative to the data section
    n_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))


@dataclass
class GGUFHeader:
    """Everything before the tensor data (no data needed: also reads layout templates)."""

    version: int
    metadata: dict[str, Any]
    value_types: dict[str, VT]
    alignment: int
    tensors: list[TensorInfo]
    header_end: int  # end of the tensor table
    data_offset: int  # header_end rounded up to the alignment


class _Bad(Exception):
    """A problem found by the cursor; ``parse_header`` adds where it was reading and the path."""


_SCALARS = {
    VT.UINT8: struct.Struct("<B"), VT.INT8: struct.Struct("<b"), VT.UINT16: struct.Struct("<H"),
    VT.INT16: struct.Struct("<h"), VT.UINT32: struct.Struct("<I"), VT.INT32: struct.Struct("<i"),
    VT.FLOAT32: struct.Struct("<f"), VT.BOOL: struct.Struct("<?"), VT.UINT64: struct.Struct("<Q"),
    VT.INT64: struct.Struct("<q"), VT.FLOAT64: struct.Struct("<d"),
}
_NUMPY = {
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2", VT.UINT32: "<u4",
    VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.BOOL: "<u1", VT.UINT64: "<u8", VT.INT64: "<i8",
    VT.FLOAT64: "<f8",
}
_U32, _U64 = _SCALARS[VT.UINT32], _SCALARS[VT.UINT64]


class _Cursor:
    """Sequential little-endian reads from a bytes-like buffer; every overrun or bad value is ``_Bad``."""

    def __init__(self, buf, pos: int = 0):
        self.buf, self.pos, self.size = buf, pos, len(buf)
        self.array_budget = MAX_ARRAY_VALUES

    def left(self) -> int:
        return self.size - self.pos

    def scalar(self, s: struct.Struct):
        if self.pos + s.size > self.size:
            raise _Bad(f"the header ends early (the file has {self.size} bytes): truncated file")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self) -> str:
        at = self.pos
        n = self.scalar(_U64)
        if n > self.left():
            raise _Bad(f"a string of {n} bytes at byte {at} runs past the end of the file "
                       f"({self.size} bytes): truncated or corrupt file")
        try:
            s = str(self.buf[self.pos:self.pos + n], "utf-8")
        except UnicodeDecodeError:
            raise _Bad(f"the string at byte {at} is not valid UTF-8") from None
        self.pos += n
        return s

    def strings(self, count: int) -> list[str]:
        # The hot loop for vocabularies: locals only, one bounds check at the end.
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                if pos + n > size:
                    break
                append(str(buf[pos:pos + n], "utf-8"))
                pos += n
        except struct.error:
            pass
        except UnicodeDecodeError:
            raise _Bad(f"element {len(out)} (a string at byte {pos - 8}) is not valid UTF-8") from None
        if len(out) < count:
            raise _Bad(f"element {len(out)} of {count} strings runs past the end of the file "
                       f"({size} bytes): truncated or corrupt file")
        self.pos = pos
        return out

    def array(self, depth: int) -> list:
        etype, at, count = self.scalar(_U32), self.pos, self.scalar(_U64)
        min_size = 8 if etype == VT.STRING else 12 if etype == VT.ARRAY else None
        if min_size is None:
            if etype not in _NUMPY:
                raise _Bad(f"unknown array element type {etype}")
            min_size = np.dtype(_NUMPY[VT(etype)]).itemsize
        if count * min_size > self.left():
            raise _Bad(f"an array of {count} elements at byte {at} cannot fit in the "
                       f"{self.left()} bytes left in the file: truncated or corrupt file")
        self.array_budget -= count
        if self.array_budget < 0:
            raise _Bad(f"metadata arrays hold more than {MAX_ARRAY_VALUES} values in all (refused)")
        if etype == VT.STRING:
            return self.strings(count)
        if etype == VT.ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise _Bad(f"arrays nested more than {MAX_ARRAY_DEPTH} deep (refused)")
            return [self.array(depth + 1) for _ in range(count)]
        arr = np.frombuffer(self.buf, _NUMPY[VT(etype)], count, self.pos)
        self.pos += count * min_size
        return (arr != 0).tolist() if etype == VT.BOOL else arr.tolist()

    def value(self, vtype: int) -> Any:
        if vtype == VT.STRING:
            return self.string()
        if vtype == VT.ARRAY:
            return self.array(1)
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[VT(vtype)])
        raise _Bad(f"unknown value type {vtype}")


def parse_header(buf, path: str | Path) -> GGUFHeader:
    """Parse magic, metadata and tensor table from ``buf`` (bytes, mmap); checks counts, types,
    shapes, alignment and that no two tensors' data overlap. Tensor data need not be present."""
    if len(buf) < 4 or buf[:4] != GGUF_MAGIC:
        raise ModelFileError(path, "not a GGUF file (bad magic)")
    cur = _Cursor(buf, 4)
    where = "the file header"
    try:
        version = cur.scalar(_U32)
        if version > 0xFFFF:
            raise ModelFileError(path, "big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise ModelFileError(path, f"unsupported GGUF version {version} (need 2 or 3)")
        n_tensors, n_kv = cur.scalar(_U64), cur.scalar(_U64)
        if n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_INFO_BYTES > cur.left():
            raise ModelFileError(path, f"the header claims {n_kv} metadata entries and {n_tensors} tensors, "
                                       f"more than a file of {cur.size} bytes can hold: truncated or corrupt file")
        metadata: dict[str, Any] = {}
        vtypes: dict[str, VT] = {}
        for i in range(n_kv):
            where = f"metadata entry {i} of {n_kv}"
            key = cur.string()
            where = f"metadata key {shown(key)}"
            if key in metadata:
                raise _Bad("appears twice")
            vtype = cur.scalar(_U32)
            metadata[key] = cur.value(vtype)
            vtypes[key] = VT(vtype)
        where = "general.alignment"
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (isinstance(alignment, bool) or not isinstance(alignment, int) or not 0 < alignment <= MAX_ALIGNMENT
                or alignment & (alignment - 1)):
            raise _Bad(f"is {shown(alignment)}; it must be a power of two up to {MAX_ALIGNMENT}")
        where = "the tensor table"
        if n_tensors * MIN_TENSOR_INFO_BYTES > cur.left():
            raise _Bad(f"the header claims {n_tensors} tensors, more than the {cur.left()} bytes left "
                       f"can describe: truncated or corrupt file")
        infos = []
        for i in range(n_tensors):
            where = f"tensor {i} of {n_tensors}"
            name = cur.string()
            where = f"tensor {shown(name)}"
            infos.append(_tensor_info(cur, name, alignment))
    except _Bad as e:
        raise ModelFileError(path, f"{where}: {e}") from None
    _check_tensor_table(infos, path)
    data_offset = -(-cur.pos // alignment) * alignment
    return GGUFHeader(version, metadata, vtypes, alignment, infos, cur.pos, data_offset)


def _tensor_info(cur: _Cursor, name: str, alignment: int) -> TensorInfo:
    n_dims = cur.scalar(_U32)
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Bad(f"{n_dims} dimensions (need 1 to {MAX_DIMS})")
    ne = tuple(cur.scalar(_U64) for _ in range(n_dims))
    type_id, offset = cur.scalar(_U32), cur.scalar(_U64)
    try:
        qtype = QT(type_id)
    except ValueError:
        raise _Bad(f"unknown tensor type id {type_id}") from None
    if qtype not in QUANTS:
        raise _Bad(f"unsupported tensor type {qtype.name}")
    q = QUANTS[qtype]
    if any(d <= 0 for d in ne) or ne[0] % q.block_size:
        raise _Bad(f"bad shape {list(ne)} for type {qtype.name} "
                   f"(rows must be a whole number of {q.block_size}-value blocks)")
    if math.prod(ne) > MAX_TENSOR_VALUES:
        raise _Bad(f"dimensions {list(ne)} multiply past {MAX_TENSOR_VALUES} values (overflow): corrupt tensor table")
    if offset % alignment:
        raise _Bad(f"data offset {offset} is not {alignment}-aligned")
    return TensorInfo(name, qtype, ne, offset, math.prod(ne[1:]) * q.row_bytes(ne[0]))


def _check_tensor_table(infos: list[TensorInfo], path) -> None:
    """Unique names; data ranges (relative to the data section) that do not overlap."""
    seen: set[str] = set()
    for t in infos:
        if t.name in seen:
            raise ModelFileError(path, f"duplicate tensor name {shown(t.name)}")
        seen.add(t.name)
    prev = None
    for t in sorted(infos, key=lambda t: t.offset):
        if prev is not None and t.offset < prev.offset + prev.n_bytes:
            raise ModelFileError(path, f"tensors {shown(prev.name)} and {shown(t.name)} overlap in the file "
                                       f"(data at {prev.offset}+{prev.n_bytes} and {t.offset}): corrupt tensor table")
        prev = t
