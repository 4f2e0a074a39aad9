"""Read GGUF files: metadata as Python values, tensors as memory-mapped raw blocks.

A light parser of our own (``gguf.GGUFReader`` builds one numpy object per array element and
takes ~10 s on a 150k-token vocabulary). Every problem with a file ends in one
:class:`ModelFileError` whose text is ``"<path>: <problem>"``.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT

from minfer_core.errors import UserError
from minfer_core.quants import QUANTS

MISSING: Any = object()
DEFAULT_ALIGNMENT = 32
GGUF_MAGIC = b"GGUF"


class ModelFileError(UserError):
    """A model file that cannot be used. ``str(e) == "<path>: <problem>"``.

    Built as ``ModelFileError(path, problem)`` (or with one ready-made message)."""

    def __init__(self, path: str | Path, problem: str | None = None):
        self.path, self.problem = str(path), problem
        super().__init__(str(path) if problem is None else f"{path}: {problem}")


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


@dataclass
class TensorEntry:
    """A tensor's raw bytes. ``shape`` is torch order (rows, cols); ``data`` is a uint8 view of
    the mapped file of shape ``shape[:-1] + (row_bytes,)`` (no copy)."""

    name: str
    qtype: QT
    shape: tuple[int, ...]
    data: np.ndarray
    offset: int = 0  # absolute offset in the file

    @property
    def n_bytes(self) -> int:
        return self.data.nbytes


@dataclass
class GGUFFile:
    """An opened GGUF file (keeps the mapping alive while any tensor view is referenced)."""

    path: Path
    metadata: dict[str, Any]
    arch: str
    tensors: dict[str, TensorEntry]
    header: GGUFHeader | None = field(default=None, repr=False)

    def get(self, key: str, default: Any = MISSING) -> Any:
        """A metadata value; a missing key without ``default`` is a :class:`ModelFileError`."""
        if key in self.metadata:
            return self.metadata[key]
        if default is MISSING:
            raise ModelFileError(self.path, f"missing metadata key {key!r}")
        return default


class _Truncated(Exception):
    pass


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
    """Sequential little-endian reads from a bytes-like buffer; overruns raise ``_Truncated``."""

    def __init__(self, buf, pos: int = 0):
        self.buf, self.pos, self.size = buf, pos, len(buf)

    def scalar(self, s: struct.Struct):
        if self.pos + s.size > self.size:
            raise _Truncated
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self) -> str:
        n = self.scalar(_U64)
        end = self.pos + n
        if end > self.size:
            raise _Truncated
        s = self.buf[self.pos:end].decode("utf-8", "replace")
        self.pos = end
        return s

    def strings(self, count: int) -> list[str]:
        # The hot loop for vocabularies: locals only, one bounds check at the end.
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        if count * 8 > size - pos:
            raise _Truncated
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                append(buf[pos:pos + n].decode("utf-8", "replace"))
                pos += n
        except struct.error:
            raise _Truncated from None
        if pos > size:
            raise _Truncated
        self.pos = pos
        return out

    def value(self, vtype: int) -> Any:
        if vtype == VT.STRING:
            return self.string()
        if vtype == VT.ARRAY:
            etype, count = self.scalar(_U32), self.scalar(_U64)
            if etype == VT.STRING:
                return self.strings(count)
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[VT(etype)])
                if count * dt.itemsize > self.size - self.pos:
                    raise _Truncated
                arr = np.frombuffer(self.buf, dt, count, self.pos)
                self.pos += count * dt.itemsize
                return (arr != 0).tolist() if etype == VT.BOOL else arr.tolist()
            if etype == VT.ARRAY:
                return [self.value(VT.ARRAY) for _ in range(count)]
            raise ValueError(f"unknown metadata array element type {etype}")
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[VT(vtype)])
        raise ValueError(f"unknown metadata value type {vtype}")


def parse_header(buf, path: str | Path) -> GGUFHeader:
    """Parse magic, metadata and tensor table from ``buf`` (bytes, mmap); checks types/shapes."""
    if len(buf) < 4 or buf[:4] != GGUF_MAGIC:
        raise ModelFileError(path, "not a GGUF file (bad magic)")
    cur = _Cursor(buf, 4)
    try:
        version = cur.scalar(_U32)
        if version > 0xFFFF:
            raise ModelFileError(path, "big-endian GGUF files are not supported")
        if version not in (2, 3):
            raise ModelFileError(path, f"unsupported GGUF version {version} (need 2 or 3)")
        n_tensors, n_kv = cur.scalar(_U64), cur.scalar(_U64)
        metadata: dict[str, Any] = {}
        vtypes: dict[str, VT] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.scalar(_U32)
            try:
                metadata[key] = cur.value(vtype)
            except ValueError as e:
                raise ModelFileError(path, f"metadata key {key!r}: {e}") from None
            vtypes[key] = VT(vtype)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ModelFileError(path, f"bad general.alignment {alignment!r}")
        infos = [_tensor_info(cur, path, alignment) for _ in range(n_tensors)]
    except _Truncated:
        raise ModelFileError(path, f"truncated file (header ends early, at byte {cur.size})") from None
    data_offset = -(-cur.pos // alignment) * alignment
    return GGUFHeader(version, metadata, vtypes, alignment, infos, cur.pos, data_offset)


def _tensor_info(cur: _Cursor, path, alignment: int) -> TensorInfo:
    name = cur.string()
    n_dims = cur.scalar(_U32)
    if not 1 <= n_dims <= 4:
        raise ModelFileError(path, f"tensor {name!r} has {n_dims} dimensions (need 1 to 4)")
    ne = tuple(cur.scalar(_U64) for _ in range(n_dims))
    type_id, offset = cur.scalar(_U32), cur.scalar(_U64)
    try:
        qtype = QT(type_id)
    except ValueError:
        raise ModelFileError(path, f"tensor {name!r} has unknown tensor type id {type_id}") from None
    if qtype not in QUANTS:
        raise ModelFileError(path, f"tensor {name!r} has unsupported tensor type {qtype.name}")
    q = QUANTS[qtype]
    if any(d <= 0 for d in ne) or ne[0] % q.block_size:
        raise ModelFileError(path, f"tensor {name!r} has bad shape {list(ne)} for type {qtype.name} "
                                   f"(rows must be a whole number of {q.block_size}-value blocks)")
    if offset % alignment:
        raise ModelFileError(path, f"tensor {name!r} data offset {offset} is not {alignment}-aligned")
    n_rows = int(np.prod(ne[1:], dtype=np.int64))
    return TensorInfo(name, qtype, ne, offset, n_rows * q.row_bytes(ne[0]))


def open_gguf(path: str | Path) -> GGUFFile:
    """Map ``path`` and read its metadata and tensor table; tensor data stays on disk."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            # Copy-on-write: writable numpy views (torch.from_numpy stays quiet), file untouched.
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except FileNotFoundError:
        raise ModelFileError(path, "file not found") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a directory, not a GGUF file") from None
    except ValueError:  # mmap of an empty file
        raise ModelFileError(path, "not a GGUF file (empty)") from None
    except OSError as e:
        raise ModelFileError(path, f"cannot read: {e.strerror or e}") from None
    header = parse_header(mm, path)
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(path, "missing metadata key 'general.architecture'")
    tensors: dict[str, TensorEntry] = {}
    for t in header.tensors:
        start = header.data_offset + t.offset
        if start + t.n_bytes > len(mm):
            raise ModelFileError(path, f"truncated file: tensor {t.name!r} needs bytes up to "
                                       f"{start + t.n_bytes}, file has {len(mm)}")
        if t.name in tensors:
            raise ModelFileError(path, f"duplicate tensor name {t.name!r}")
        row_bytes = QUANTS[t.qtype].row_bytes(t.ne[0])
        data = np.frombuffer(mm, np.uint8, t.n_bytes, start).reshape(t.shape[:-1] + (row_bytes,))
        tensors[t.name] = TensorEntry(t.name, t.qtype, t.shape, data, start)
    return GGUFFile(path, header.metadata, arch, tensors, header)
