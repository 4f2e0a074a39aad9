"""Hostile GGUF files (issue #14): every one ends in ONE line ``minfer: error: FILE: problem`` and exit
status 2, fast, without a hang, a traceback or memory that grows with what the header claims.

The named cases are the ones a hostile user reported; the fuzzer mutates a valid small model's
fields (counts, lengths, type ids, dims, offsets, floats), truncates and flips bytes, and checks
the same contract for every outcome; files that still load must then generate without a crash.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT, GGUFReader, GGUFValueType as VT

from gguf_craft import Val, craft, nested_arrays, small_model
from minfer_core import cli, gguf_header
from minfer_core.engine import Engine
from minfer_core.errors import UserError
from minfer_core.gguf_file import ModelFileError, open_gguf
from minfer_core.sampling import SamplerConfig

MEMORY_LIMIT = 64 << 20  # bytes Python may allocate while a bad file is refused
TIME_LIMIT = 2.0  # seconds per file (most take milliseconds)


def load(path) -> Engine:
    return Engine.load(path, device="cpu", backend="reference", progress=False, n_ctx=64)


def refused(path, *fragments: str) -> str:
    """``Engine.load`` (the library entry point) raises one ModelFileError line naming ``path``;
    it is quick and allocates little."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ModelFileError) as ei:
            load(path)
        elapsed, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(ei.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg and len(msg) < len(str(path)) + 500, msg
    for f in fragments:
        assert f in msg, msg
    assert elapsed < TIME_LIMIT and peak < MEMORY_LIMIT, (elapsed, peak)
    return msg


def cli_refuses(path, capsys, msg: str) -> None:
    """``minfer run -m FILE -p hi -n 1``: status 2, and stderr is that one line."""
    capsys.readouterr()
    assert cli.main(["run", "-m", str(path), "-p", "hi", "-n", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"minfer: error: {msg}\n", err


# -- building the files ----------------------------------------------------------------------------

def write(tmp_path, md, ts, name="bad", patch=None, cut=None, replace=None, **kw) -> Path:
    c = craft(md, ts, **kw)
    for label, value in (patch or {}).items():
        c.patch(label, value(c) if callable(value) else value)
    data = bytes(c.buf if cut is None else c.buf[:cut(c) if callable(cut) else cut])
    for old, new in (replace or {}).items():
        data = data.replace(old, new, 1)
    p = tmp_path / f"{name}.gguf"
    p.write_bytes(data)
    return p


def meta(**changes):
    """An edit that sets (or with None deletes) metadata keys; ``__`` stands for ``.``."""
    def edit(md, ts):
        for k, v in changes.items():
            k = k.replace("__", ".")
            md.pop(k, None) if v is None else md.__setitem__(k, v)
    return edit


def tensor(name, qtype=None, shape=None, drop=False, add=False):
    def edit(md, ts):
        i = next((i for i, t in enumerate(ts) if t[0] == name), None)
        if drop:
            ts.pop(i)
        elif add:
            ts.append((name, qtype, shape))
        else:
            ts[i] = (name, qtype or ts[i][1], shape or ts[i][2])
    return edit


def vocab(n_delta):
    """Drop or add tokens (and their types) without touching the embedding."""
    def edit(md, ts):
        toks, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
        if n_delta < 0:
            del toks[n_delta - 1:-1], types[n_delta - 1:-1]  # keep <|endoftext|> last
        else:
            toks[-1:-1], types[-1:-1] = [f"extra{i}" for i in range(n_delta)], [1] * n_delta
        md["tokenizer.ggml.eos_token_id"] = md["tokenizer.ggml.bos_token_id"] = len(toks) - 1
    return edit


def field_value(label):
    return lambda c: struct.unpack_from(c.fields[label][1], c.buf, c.fields[label][0])[0]


Q = "blk.0.attn_q.weight"
# (id, edit of the small model, write() options, message fragments)
CASES = [
    # file header and metadata encoding
    ("bad-magic", None, dict(replace={b"GGUF": b"GGML"}), ["not a GGUF file"]),
    ("version-1", None, dict(patch={"version": 1}), ["unsupported GGUF version 1"]),
    ("kv-count-huge", None, dict(patch={"n_kv": 2**63}), ["metadata entries", "corrupt"]),
    ("tensor-count-huge", None, dict(patch={"n_tensors": 2**40}), ["tensors", "corrupt"]),
    ("truncated-metadata", None, dict(cut=lambda c: c.fields["vtype:qwen2.block_count"][0] + 2), ["truncated"]),
    ("truncated-tensor-table", None, dict(cut=lambda c: c.fields[f"ne1:{Q}"][0] + 3), ["tensor table", "truncated"]),
    ("truncated-last-tensor-info", None, dict(cut=lambda c: c.fields["ne1:output.weight"][0] + 3),
     ["'output.weight'", "truncated"]),
    ("truncated-data", None, dict(cut=lambda c: len(c.buf) - 100), ["'output.weight'", "truncated"]),
    ("string-length-huge", None, dict(patch={"strlen:general.name": 2**63}), ["runs past the end"]),
    ("key-length-huge", None, dict(patch={"keylen:general.name": 2**62}), ["runs past the end"]),
    ("invalid-utf8-key", lambda md, ts: md.__setitem__(b"general.n\xffme", 1), {}, ["not valid UTF-8"]),
    ("invalid-utf8-value", meta(general__name=b"caf\xe9"), {}, ["'general.name'", "not valid UTF-8"]),
    ("invalid-utf8-token", lambda md, ts: md["tokenizer.ggml.tokens"].__setitem__(100, b"\xc3("), {},
     ["'tokenizer.ggml.tokens'", "element 100", "not valid UTF-8"]),
    ("unknown-value-type", None, dict(patch={"vtype:general.name": 99}), ["unknown value type 99"]),
    ("unknown-array-type", None, dict(patch={"etype:tokenizer.ggml.merges": 77}), ["unknown array element type 77"]),
    ("array-length-huge", None, dict(patch={"count:tokenizer.ggml.token_type": 2**62}), ["cannot fit"]),
    ("string-array-length-huge", None, dict(patch={"count:tokenizer.ggml.tokens": 2**61}), ["cannot fit"]),
    ("nested-arrays", meta(general__deep=nested_arrays(10_000)), {}, ["nested more than"]),
    ("duplicate-key", meta(general__nam2="x"), dict(replace={b"general.nam2": b"general.name"}), ["appears twice"]),
    ("alignment-not-power-of-two", meta(general__alignment=48), {}, ["general.alignment", "power of two"]),
    ("alignment-zero", meta(general__alignment=0), {}, ["general.alignment"]),
    ("alignment-huge", meta(general__alignment=2**31), {}, ["general.alignment", "power of two up to"]),
    ("alignment-string", meta(general__alignment="32"), {}, ["general.alignment"]),
    # tensor table
    ("tensor-ndims-0", None, dict(patch={f"ndims:{Q}": 0}), [repr(Q), "0 dimensions"]),
    ("tensor-ndims-5", None, dict(patch={f"ndims:{Q}": 5}), [repr(Q), "5 dimensions"]),
    ("tensor-dim-zero", None, dict(patch={f"ne1:{Q}": 0}), [repr(Q), "bad shape"]),
    ("tensor-dims-overflow", None, dict(patch={"ne1:token_embd.weight": 2**62}), ["overflow"]),
    ("tensor-offset-misaligned", None, dict(patch={f"offset:{Q}": lambda c: field_value(f"offset:{Q}")(c) + 4}),
     ["not 32-aligned"]),
    ("tensor-offset-out-of-file", None, dict(patch={"offset:output.weight": 2**40}), ["bad tensor offset"]),
    ("tensor-overlap", None, dict(patch={"offset:blk.0.attn_k.weight": field_value(f"offset:{Q}")}), ["overlap"]),
    ("duplicate-tensor", tensor("blk.0.attn_norm.weight", QT.F32, (64,), add=True), {}, ["duplicate tensor name"]),
    ("unknown-tensor-type", None, dict(patch={f"type:{Q}": 250}), ["unknown tensor type id 250"]),
    ("unsupported-tensor-type", None, dict(patch={f"type:{Q}": int(QT.IQ2_XXS)}), ["unsupported tensor type IQ2_XXS"]),
    # hyper-parameters
    ("no-architecture", meta(general__architecture=None), {}, ["'general.architecture'"]),
    ("architecture-not-string", meta(general__architecture=7), {}, ["'general.architecture'"]),
    ("unsupported-architecture", lambda md, ts: md.update({"general.architecture": "gpt2"}), {},
     ["unsupported architecture 'gpt2'"]),
    ("block-count-2**40", meta(qwen2__block_count=2**40), {}, ["block_count", "out of range"]),
    ("block-count-int-max", meta(qwen2__block_count=2**31 - 1), {}, ["is 2147483647 but", "blocks 0..0"]),
    ("block-count-0", meta(qwen2__block_count=0), {}, ["block_count", "out of range"]),
    ("block-count-negative", meta(qwen2__block_count=Val(VT.INT32, -3)), {}, ["block_count", "out of range"]),
    ("block-count-too-many", meta(qwen2__block_count=5), {}, ["is 5 but", "blocks 0..0", "inconsistent"]),
    ("block-count-nan", meta(qwen2__block_count=math.nan), {}, ["block_count", "bad value"]),
    ("block-count-string", meta(qwen2__block_count="two"), {}, ["block_count", "bad value"]),
    ("context-length-0", meta(qwen2__context_length=0), {}, ["context_length", "out of range"]),
    ("heads-not-dividing-embd", meta(qwen2__attention__head_count=3), {}, ["not divisible by 3 heads"]),
    ("kv-heads-not-dividing-heads", meta(qwen2__attention__head_count_kv=3), {}, ["cannot share 3 KV heads"]),
    ("heads-0", meta(qwen2__attention__head_count=0), {}, ["head_count", "out of range"]),
    ("head-dim-odd", meta(qwen2__attention__key_length=33), {}, ["head size 33 is odd"]),
    ("partial-rope", meta(qwen2__rope__dimension_count=16), {}, ["partial RoPE"]),
    ("rope-scaling", meta(qwen2__rope__scaling__type="yarn"), {}, ["RoPE scaling 'yarn'"]),
    *[(f"rope-base-{v}", meta(qwen2__rope__freq_base=v), {}, ["rope.freq_base", "finite number above 1"])
      for v in (math.nan, math.inf, 0.0, -10000.0)],
    *[(f"rms-eps-{v}", meta(qwen2__attention__layer_norm_rms_epsilon=v), {}, ["layer_norm_rms_epsilon", "finite"])
      for v in (math.nan, -math.inf, 0.0, -1e-6, 2.0)],
    # tensors against the hyper-parameters
    ("vocab-shorter-than-embedding", vocab(-1), {}, ["tokenizer has 259 tokens but token_embd.weight has 260 rows"]),
    ("vocab-longer-than-embedding", vocab(3), {}, ["tokenizer has 263 tokens but token_embd.weight has 260 rows"]),
    ("vocab-size-key", meta(qwen2__vocab_size=1000), {}, ["vocab_size", "260 rows"]),
    ("tensor-wrong-shape", tensor("blk.0.attn_k.weight", shape=(64, 64)), {}, ["has shape [64, 64], expected [32, 64]"]),
    ("tensor-missing", tensor("blk.0.ffn_up.weight", drop=True), {}, ["missing tensor 'blk.0.ffn_up.weight'"]),
    ("tensor-unexpected", tensor("blk.0.attn_q_norm.weight", QT.F32, (32,), add=True), {},
     ["unexpected tensor 'blk.0.attn_q_norm.weight'"]),
    ("tensor-block-beyond-count", tensor("blk.7.attn_norm.weight", QT.F32, (64,), add=True), {},
     ["block_count' is 1 but", "with gaps"]),
    ("norm-not-f32", tensor("blk.0.attn_norm.weight", QT.F16), {}, ["type F16, expected F32"]),
    ("bias-wrong-shape", tensor("blk.0.attn_output.bias", QT.F32, (32,), add=True), {}, ["has shape [32]"]),
    ("embedding-1d", tensor("token_embd.weight", QT.F32, (260 * 64,)), {}, ["expected 2 dimensions"]),
    # tokenizer arrays
    ("tokens-int-array", meta(tokenizer__ggml__tokens=list(range(260))), {}, ["tokens must be an array of strings"]),
    ("tokens-string", meta(tokenizer__ggml__tokens="abc"), {}, ["tokens must be an array of strings"]),
    ("tokens-missing", meta(tokenizer__ggml__tokens=None), {}, ["tokenizer.ggml.tokens is missing"]),
    ("token-type-short", lambda md, ts: md["tokenizer.ggml.token_type"].__delitem__(slice(-5, None)), {},
     ["token_type has 255 entries for 260 tokens"]),
    ("token-type-strings", meta(tokenizer__ggml__token_type=["1"] * 260), {}, ["array of integers"]),
    ("merges-missing", meta(tokenizer__ggml__merges=None), {}, ["merges is missing"]),
    ("merges-ints", meta(tokenizer__ggml__merges=[1, 2]), {}, ["merges must be an array of strings"]),
    ("bos-id-string", meta(tokenizer__ggml__bos_token_id="1"), {}, ["bos_token_id is '1', not a token id"]),
    ("byte-token-malformed", lambda md, ts: (md["tokenizer.ggml.tokens"].__setitem__(0, "<0xZZ>"),
                                             md["tokenizer.ggml.token_type"].__setitem__(0, 6)), {}, ["BYTE"]),
    ("tokenizer-model", meta(tokenizer__ggml__model="llama"), {}, ["'llama' is not supported"]),
    ("pre-tokenizer-unknown", meta(tokenizer__ggml__pre="no-such"), {}, ["unsupported pre-tokenizer"]),
    ("add-bos-string", meta(tokenizer__ggml__add_bos_token="yes"), {}, ["add_bos_token is 'yes'"]),
]


@pytest.mark.parametrize("edit,opts,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_file(tmp_path, capsys, edit, opts, fragments):
    md, ts = small_model()
    if edit:
        edit(md, ts)
    path = write(tmp_path, md, ts, **opts)
    cli_refuses(path, capsys, refused(path, *fragments))


def test_crafted_baseline_is_valid(tmp_path, capsys):
    """The files above differ from this one by the corruption alone: gguf's own reader reads it and
    minfer runs it."""
    path = write(tmp_path, *small_model(), name="ok")
    r = GGUFReader(path)
    assert r.fields["qwen2.block_count"].contents() == 1 and len(r.tensors) == 15
    assert cli.main(["--backend", "reference", "run", "-m", str(path), "-p", "hi", "-n", "2", "--temp", "0",
                     "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("hi")


def test_two_block_count_fewer_than_tensors(tmp_path, capsys):
    md, ts = small_model(n_layers=2)
    md["qwen2.block_count"] = 1
    path = write(tmp_path, md, ts)
    cli_refuses(path, capsys, refused(path, "is 1 but the tensor table holds blocks 0..1"))


@pytest.mark.parametrize("argv", [["gates"], ["bench"], ["chat"], ["parity"], ["perplexity", "-f", "TEXT"],
                                  ["tokenize", "hi"]], ids=lambda a: a[0])
def test_every_command_refuses(tmp_path, capsys, argv):
    """Every command that opens a model: one line, status 2 (tokenize reads only the vocabulary)."""
    md, ts = small_model()
    md["qwen2.block_count"] = 2**40
    md["tokenizer.ggml.token_type"] = md["tokenizer.ggml.token_type"][:-1]
    path = write(tmp_path, md, ts)
    (tmp_path / "text.txt").write_text("hello world " * 40)
    argv = [str(tmp_path / "text.txt") if a == "TEXT" else a for a in argv]
    capsys.readouterr()
    assert cli.main([argv[0], "-m", str(path), *argv[1:]]) == 2
    out, err = capsys.readouterr()
    want = "token_type has 259 entries" if argv[0] == "tokenize" else "block_count' is 1099511627776"
    assert out == "" and err.startswith(f"minfer: error: {path}: ") and err.count("\n") == 1 and want in err, err


def test_nul_in_path():
    with pytest.raises(ModelFileError, match="bad file name"):
        open_gguf("model\0.gguf")


def test_metadata_array_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_header, "MAX_ARRAY_VALUES", 1000)
    md, ts = small_model()
    md["general.big"] = list(range(2000))
    refused(write(tmp_path, md, ts), "more than 1000 values in all")


# -- paths that are not model files ------------------------------------------------------------

def _symlink_loop(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _dangling(tmp_path):
    p = tmp_path / "dangling.gguf"
    p.symlink_to(tmp_path / "gone.gguf")
    return p


def _file(tmp_path, data: bytes):
    p = tmp_path / "file.gguf"
    p.write_bytes(data)
    return p


def _fifo(tmp_path):
    p = tmp_path / "pipe.gguf"
    os.mkfifo(p)
    return p


PATHS = [
    ("directory", lambda t: (t / "dir.gguf").mkdir() or t / "dir.gguf", "is a directory"),
    ("dev-zero", lambda t: Path("/dev/zero"), "character device"),
    ("symlink-loop", _symlink_loop, "symbolic link loop"),
    ("dangling-symlink", _dangling, "file not found"),
    ("missing", lambda t: t / "nope.gguf", "file not found"),
    ("empty", lambda t: _file(t, b""), "empty"),
    ("text", lambda t: _file(t, b"hello, I am not a model\n"), "bad magic"),
]


@pytest.mark.parametrize("make,fragment", [p[1:] for p in PATHS], ids=[p[0] for p in PATHS])
def test_bad_path(tmp_path, capsys, make, fragment):
    path = make(tmp_path)
    cli_refuses(path, capsys, refused(path, fragment))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path, capsys):
    p = write(tmp_path, *small_model())
    p.chmod(0)
    cli_refuses(p, capsys, refused(p, "permission denied"))


def test_permission_denied_message(tmp_path, monkeypatch):
    """EACCES from open(2) (what a non-root user meets; root never does) becomes the one line."""
    p = write(tmp_path, *small_model())

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ModelFileError, match="permission denied: make the file readable"):
        open_gguf(p)


def test_fifo_through_the_cli_process(tmp_path):
    """A FIFO nobody writes to (opening it for reading would block forever): the real process ends
    at once with one line and status 2. (Not tried in-process: a regression would hang the suite.)"""
    path = _fifo(tmp_path)
    res = subprocess.run([sys.executable, "-m", "minfer_core.cli", "run", "-m", str(path), "-p", "hi", "-n", "1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res.stderr
    assert res.stderr == f"minfer: error: {path}: is a named pipe (FIFO), not a regular file: " \
                         f"give the path of a .gguf model file\n"


# -- fuzzing -------------------------------------------------------------------------------------

EXTREMES = {
    "<Q": [0, 1, 2, 3, 7, 255, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1],
    "<I": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 31, 255, 2**31 - 1, 2**31, 2**32 - 1],
    "<i": [0, 1, -1, 2**31 - 1, -2**31],
    "<q": [0, 1, -1, 2**63 - 1, -2**63],
    "<f": [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-45, 3.4e38, 1.0, 0.5],
    "<?": [False, True],
}


def mutate(base, rng: np.random.Generator, size: int) -> tuple[bytes, str]:
    """One mutation of the crafted file ``base``: a field set to an extreme or random value,
    a truncation, or flipped/copied header bytes. Returns the bytes and a description."""
    buf = bytearray(base.buf)
    header_end = max(at for at, _ in base.fields.values()) + 8
    kind = rng.choice(["field", "field", "field", "cut", "flip", "copy"])
    if kind == "field":
        groups = sorted({label.split("[")[0] for label in base.fields})
        group = groups[rng.integers(len(groups))]
        labels = [lb for lb in base.fields if lb.split("[")[0] == group]
        label = labels[rng.integers(len(labels))]
        at, fmt = base.fields[label]
        choices = EXTREMES[fmt]
        value = choices[rng.integers(len(choices))]
        if fmt in ("<Q", "<I") and rng.random() < 0.3:  # near the old value
            value = max(0, struct.unpack_from(fmt, buf, at)[0] + int(rng.integers(-40, 41)))
            value = min(value, 2**32 - 1) if fmt == "<I" else value
        struct.pack_into(fmt, buf, at, value)
        return bytes(buf), f"{label} = {value!r}"
    if kind == "cut":
        n = int(rng.integers(0, size))
        return bytes(buf[:n]), f"cut at {n}"
    if kind == "flip":
        spots = rng.integers(0, header_end, int(rng.integers(1, 9)))
        for s in spots:
            buf[s] ^= int(rng.integers(1, 256))
        return bytes(buf), f"flip {sorted(spots.tolist())}"
    src, dst, n = rng.integers(0, header_end, 2).tolist() + [int(rng.integers(1, 64))]
    buf[dst:dst + n] = base.buf[src:src + n]
    return bytes(buf[:len(base.buf)]), f"copy {n} bytes {src} -> {dst}"


GENERATE = SamplerConfig(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0)  # any id may come out


@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_headers(tmp_path, seed):
    """Each mutated file is either refused with one ModelFileError line (quickly, in bounded memory)
    or loads and then generates without any other exception."""
    md, ts = small_model("llama" if seed % 2 else "qwen2")
    base = craft(md, ts)
    rng = np.random.default_rng(seed)
    outcomes = {"refused": 0, "ran": 0}
    for case in range(40):
        data, what = mutate(base, rng, len(base.buf))
        path = tmp_path / f"fuzz{case}.gguf"
        path.write_bytes(data)
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            engine = load(path)
        except ModelFileError as e:
            msg = str(e)
            assert msg.startswith(f"{path}: ") and "\n" not in msg and len(msg) < len(str(path)) + 500, (what, msg)
            outcomes["refused"] += 1
            engine = None
        except Exception as e:  # pragma: no cover - the failure this test exists to catch
            pytest.fail(f"seed {seed} case {case} ({what}): {type(e).__name__}: {e}")
        finally:
            elapsed, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert elapsed < TIME_LIMIT and (engine is not None or peak < MEMORY_LIMIT), (what, elapsed, peak)
        if engine is not None:
            ids = engine.tok.encode("the hi")
            gen = engine.generate(ids or [0], n_predict=3, sampling=GENERATE)
            assert all(0 <= t < engine.cfg.vocab_size for t in gen.tokens)
            outcomes["ran"] += 1
    assert outcomes["refused"] >= 10, outcomes  # the mutations do reach the checks


def test_a_context_too_large_for_memory_is_one_line(tmp_path, monkeypatch):
    """``-c 0`` takes the file's context length; a K/V cache that cannot fit is refused before the
    weights load, naming the file and the flag to change."""
    from test_config import build

    from minfer_core import engine as eng

    path = build(tmp_path)
    monkeypatch.setattr(eng, "free_memory", lambda dev: 256 << 10)  # 256 KiB free: 512 tokens need 1 MiB, 4 need 8 KiB
    with pytest.raises(UserError) as ei:
        eng.Engine.load(path, backend="reference", device="cpu", n_ctx=0, progress=False)
    assert str(path) in str(ei.value) and "-c" in str(ei.value)
    assert eng.Engine.load(path, backend="reference", device="cpu", n_ctx=4, progress=False).model.n_ctx == 4
