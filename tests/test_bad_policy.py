"""Hostile or careless policy files (issue #14): repeated keys, anchors and aliases (alias bombs),
oversized files, and values of the wrong exact type. Each is one line naming the file, the key
path and what is expected; the CLI exits 2."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from minfer_core.cli import main
from minfer_core.gates import resolve_gates
from minfer_core.policy import PolicyError, load_policy
from minfer_core.strict_yaml import MAX_BYTES
from test_dispatch import gate_table

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (ROOT / "configs" / "gates.yaml").read_text()
KNOWN = {"reference", "mmq_triton", "f16_wmma", "cuda_graphs"}


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    return p


def refused(path: Path) -> str:
    with pytest.raises(PolicyError) as e:  # read, then placed against mmq_triton's declarations
        resolve_gates(load_policy(path, known_plugins=KNOWN), gate_table(), {})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg


def with_line_after(anchor: str, line: str) -> str:
    """The shipped policy with ``line`` inserted right after the first line containing ``anchor``."""
    head, sep, tail = SHIPPED.partition(anchor)
    assert sep, anchor
    first, nl, rest = tail.partition("\n")
    return head + sep + first + nl + line + "\n" + rest


# -- duplicate keys ---------------------------------------------------------------------------

def test_second_gate_entry_is_refused_not_silently_winning(tmp_path):
    # a second MINFER_MMQ entry set to off used to replace the first and turn the gate off
    text = with_line_after("    MINFER_MMQ_Q4K_DSC: on", "    MINFER_MMQ: off")
    msg = refused(write(tmp_path, text))
    assert ": gates.mmq_triton.MINFER_MMQ: key given twice (lines " in msg and "keep one" in msg


def test_duplicate_plugin_section_names_its_path(tmp_path):
    text = with_line_after("    MINFER_PDL: on", "  mmq_triton:\n    MINFER_MMQ: off")
    assert ": gates.mmq_triton: key given twice" in refused(write(tmp_path, text))


def test_duplicate_top_level_key(tmp_path):
    assert ": version: key given twice" in refused(write(tmp_path, SHIPPED + "\nversion: 1\n"))


# -- anchors and aliases ----------------------------------------------------------------------

def test_alias_bomb_is_refused_before_it_expands(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]  # 10**10 strings
    path = write(tmp_path, "\n".join(levels) + "\n" + SHIPPED)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    msg = refused(path)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert ": line 1: YAML anchor &a0 is not allowed in a policy" in msg
    assert grown_kib < 100 * 1024  # nothing was expanded


def test_plain_anchor_is_refused(tmp_path):
    text = SHIPPED.replace("    MINFER_MMQ_RAW: on", "    MINFER_MMQ_RAW: &yes on", 1)
    assert "YAML anchor &yes is not allowed in a policy (write the value out)" in refused(write(tmp_path, text))


def test_merge_key_alias_is_refused(tmp_path):
    text = SHIPPED.replace("  mmq_triton:\n", "  mmq_triton: &mmq\n", 1) + "  f16_wmma:\n    <<: *mmq\n"
    assert "YAML anchor &mmq is not allowed" in refused(write(tmp_path, text))


# -- size ----------------------------------------------------------------------------------------

def test_oversized_file_is_refused_without_parsing(tmp_path):
    path = write(tmp_path, SHIPPED + "# " + "x" * MAX_BYTES + "\n")
    assert refused(path) == f"{path}: file: larger than {MAX_BYTES // 1024} KiB; not a policy file"


# -- exact types --------------------------------------------------------------------------------

@pytest.mark.parametrize("value,problem", [
    ("1.0", "expected on, off or an integer mode, got 1.0"),
    ('"2"', "expected on, off or an integer mode, got '2'"),
    ("2.5", "expected on, off or an integer mode, got 2.5"),
    ("true", "expected a mode 0, 1 or 2, got True"),  # bool is not int
    ("on", "expected a mode 0, 1 or 2, got True"),
    ("3", "expected a mode 0, 1 or 2, got 3"),
])
def test_fuse_mode_must_be_an_integer_mode(tmp_path, value, problem):
    text = SHIPPED.replace("    MINFER_MMQ_A_FUSE: 2", f"    MINFER_MMQ_A_FUSE: {value}", 1)
    assert f"MINFER_MMQ_A_FUSE: {value}" in text
    assert refused(write(tmp_path, text)).endswith(f": gates.mmq_triton.MINFER_MMQ_A_FUSE: {problem}")


@pytest.mark.parametrize("value,problem", [
    ("1", "expected on or off, got 1"), ("0", "expected on or off, got 0"),
    ('"on"', "expected on, off or an integer mode, got 'on'"), ("1.0", "expected on, off or an integer mode, got 1.0"),
])
def test_switch_must_be_a_boolean(tmp_path, value, problem):
    text = SHIPPED.replace("    MINFER_MMQ_RAW: on", f"    MINFER_MMQ_RAW: {value}", 1)
    assert refused(write(tmp_path, text)).endswith(f": gates.mmq_triton.MINFER_MMQ_RAW: {problem}")


@pytest.mark.parametrize("value", ["1.0", "true", '"1"'])
def test_version_must_be_the_integer_1(tmp_path, value):
    msg = refused(write(tmp_path, SHIPPED.replace("version: 1", f"version: {value}", 1)))
    assert ": version: unsupported version " in msg and "(expected 1)" in msg


# -- the command line -----------------------------------------------------------------------------

def test_cli_duplicate_key_is_one_line_exit_2(tmp_path, capsys):
    path = write(tmp_path, with_line_after("    MINFER_MMQ_RAW: on", "    MINFER_MMQ_RAW: off"))
    assert main(["--policy", str(path), "gates"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minfer: error: {path}: gates.mmq_triton.MINFER_MMQ_RAW: key given twice")
    assert err.count("\n") == 1
