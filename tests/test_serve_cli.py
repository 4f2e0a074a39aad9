"""``minfer serve`` flag errors: one line, exit 2, before any model is loaded."""

from __future__ import annotations

import pytest

from minfer_core.cli import main
from minfer_core.errors import UserError


@pytest.mark.parametrize("flags,needle", [
    (["--parallel", "0"], "--parallel must be >= 1"),
    (["--max-queue", "-1"], "--max-queue must be >= 0"),
    (["--gpu-memory", "0"], "--gpu-memory"),
    (["--port", "70000"], "--port must be in 0..65535"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout"),
    (["--shutdown-timeout", "nan"], "a finite number"),  # not a silent 0 (max(0.0, nan) is 0.0)
    (["--gpu-memory", "nan"], "a finite number"),  # int(nan) in the KV pool's sizing
    (["--gpu-memory", "inf"], "a finite number"),
    (["--ctx-size", "-1"], "--ctx-size"),
])
def test_bad_flags(capsys, tmp_path, flags, needle):
    assert main(["serve", "-m", str(tmp_path / "absent.gguf"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: ") and needle in err and err.count("\n") == 1


def test_port_in_use(capsys, tmp_path):
    from minfer_core.commands.serve import bind

    sock = bind("127.0.0.1", 0)
    try:
        with pytest.raises(UserError) as e:
            bind("127.0.0.1", sock.getsockname()[1])
        assert "cannot listen" in str(e.value) and "--port" in str(e.value)
    finally:
        sock.close()


def test_ctx_beyond_the_model_is_refused(capsys, tmp_path):
    """As `minfer run -c` is: an explicit context over the model's is an error, not silently shrunk."""
    from test_config import build

    assert main(["--backend", "reference", "serve", "-m", str(build(tmp_path)), "-c", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: -c 100000") and "512" in err and err.count("\n") == 1, err
