"""Read GGUF files: metadata as Python values, tensors as memory-mapped raw blocks.

A light parser of our own (``gguf.GGUFReader`` builds one numpy object per array element and
takes ~10 s on a 150k-token vocabulary; the parser is :mod:`minfer_core.gguf_header`). Every
problem with a file, from a FIFO given as the path to a tensor that runs past the end, ends in one
:class:`ModelFileError` whose text is ``"<path>: <problem>"``.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT

from minfer_core.gguf_header import (  # noqa: F401  (re-exported: the public names of GGUF reading)
    DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFHeader, ModelFileError, TensorInfo, parse_header, shown,
)
from minfer_core.quants import QUANTS

MISSING: Any = object()
_KINDS = ((stat.S_ISDIR, "is a directory, not a GGUF file"),
          (stat.S_ISFIFO, "is a named pipe (FIFO), not a regular file"),
          (stat.S_ISCHR, "is a character device, not a regular file"),
          (stat.S_ISBLK, "is a block device, not a regular file"),
          (stat.S_ISSOCK, "is a socket, not a regular file"))


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


def map_file(path: str | Path, access: int = mmap.ACCESS_COPY) -> mmap.mmap:
    """Map a regular, non-empty file. Anything else (missing, a directory, a FIFO, a device, a
    symlink loop, no permission) is a :class:`ModelFileError`; nothing here can block."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # refuse FIFOs before opening them
            _not_regular(path, mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)  # the path may have been swapped since the stat above
            if not stat.S_ISREG(st.st_mode):
                _not_regular(path, st.st_mode)
            if st.st_size == 0:
                raise ModelFileError(path, "not a GGUF file (empty: 0 bytes)")
            return mmap.mmap(fd, 0, access=access)
        finally:
            os.close(fd)
    except OSError as e:
        raise ModelFileError(path, _os_problem(e)) from None
    except ValueError:  # a NUL in the name
        raise ModelFileError(path, "bad file name") from None


def _not_regular(path, mode: int) -> None:
    why = next((text for test, text in _KINDS if test(mode)), "is not a regular file")
    raise ModelFileError(path, f"{why}: give the path of a .gguf model file")


def _os_problem(e: OSError) -> str:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return "file not found" + (" (a part of the path is not a directory)" if e.errno == errno.ENOTDIR else "")
    why = {errno.ELOOP: "symbolic link loop (too many levels of symbolic links): fix or remove the link",
           errno.EACCES: "permission denied: make the file readable (chmod) or run as its owner",
           errno.EPERM: "permission denied: make the file readable (chmod) or run as its owner"}
    return f"cannot read: {why.get(e.errno) or e.strerror or e}"


def open_gguf(path: str | Path) -> GGUFFile:
    """Map ``path`` and read its metadata and tensor table; tensor data stays on disk but must
    lie inside the file."""
    path = Path(path)
    # Copy-on-write: writable numpy views (torch.from_numpy stays quiet), file untouched.
    mm = map_file(path)
    header = parse_header(mm, path)
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(path, "missing metadata key 'general.architecture' (or not a string)")
    tensors: dict[str, TensorEntry] = {}
    for t in header.tensors:
        start = header.data_offset + t.offset
        if start + t.n_bytes > len(mm):
            raise ModelFileError(path, f"tensor {shown(t.name)} needs bytes {start} to {start + t.n_bytes}, "
                                       f"the file has {len(mm)}: truncated file or bad tensor offset")
        row_bytes = QUANTS[t.qtype].row_bytes(t.ne[0])
        data = np.frombuffer(mm, np.uint8, t.n_bytes, start).reshape(t.shape[:-1] + (row_bytes,))
        tensors[t.name] = TensorEntry(t.name, t.qtype, t.shape, data, start)
    return GGUFFile(path, header.metadata, arch, tensors, header)
