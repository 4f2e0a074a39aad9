"""Synthesize a full-size GGUF model from a layout template (header only, optionally .xz).

The output keeps the template's header byte for byte (metadata, tokenizer, tensor table) and fills
each tensor with random, well-scaled data of its own type: norms are 1.0, biases ~N(0, 0.01),
weights dequantize to values of std ~0.02 (finite f16 scales, K-quant sub-scales in range).
Chunks are generated on a thread pool (numpy releases the GIL) and streamed to disk in order.
"""

from __future__ import annotations

import lzma
import mmap
import os
import shutil
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT, GGUFWriter
from tqdm import tqdm

from minfer_core.errors import UserError
from minfer_core.gguf_file import GGUFHeader, ModelFileError, TensorInfo, map_file, parse_header
from minfer_core.quants import QUANTS

WEIGHT_STD = 0.02
BIAS_STD = 0.01
CHUNK_BYTES = 8 << 20
MAX_TEMPLATE_BYTES = 1 << 30  # decompressed .xz template (real ones: ~6 MB)
_FLOAT_TYPES = {QT.F32: np.float32, QT.F16: np.float16, QT.BF16: np.uint16}


def read_template(template: Path) -> tuple[bytes, GGUFHeader]:
    """The template's bytes (``.xz`` is decompressed) and its parsed header."""
    with map_file(template, mmap.ACCESS_READ) as mm:  # a regular file (a FIFO would block)
        raw = mm[:]
    if raw[:6] == b"\xfd7zXZ\x00":
        dec = lzma.LZMADecompressor()
        try:
            raw = dec.decompress(raw, max_length=MAX_TEMPLATE_BYTES)
        except lzma.LZMAError as e:
            raise ModelFileError(template, f"bad xz data: {e}") from None
        if not dec.eof:
            raise ModelFileError(template, f"xz data is cut short or holds more than {MAX_TEMPLATE_BYTES} bytes "
                                           f"(a layout template is a GGUF header, a few MB)")
    return raw, parse_header(raw, template)


def synthesize(template: Path, out: Path, seed: int = 0, progress: bool = True) -> None:
    """Write ``out``: the template's header, then random tensor data (deterministic in ``seed``)."""
    template, out = Path(template), Path(out)
    raw, h = read_template(template)
    tensors = sorted(h.tensors, key=lambda t: t.offset)
    end = max((t.offset + t.n_bytes for t in tensors), default=0)  # parse_header refused overlaps
    total = h.data_offset + -(-end // h.alignment) * h.alignment
    free = shutil.disk_usage(out.parent if out.parent.exists() else Path.cwd()).free
    if total > free:
        raise UserError(f"{out}: the template's tensors take {total / 2**30:.2f} GiB, more than the "
                        f"{free / 2**30:.2f} GiB free there: free space or write elsewhere")
    tmp = out.with_name(out.name + ".part")
    workers = max(1, min(16, os.cpu_count() or 1))
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=out.name, file=sys.stderr,
               disable=not progress, mininterval=0.5)
    try:
        with open(tmp, "wb") as fh, ThreadPoolExecutor(workers) as pool:
            fh.write(raw[:h.header_end])
            fh.write(bytes(h.data_offset - h.header_end))
            bar.update(h.data_offset)
            pending: deque = deque()
            for job in _jobs(tensors, seed):
                pending.append(pool.submit(_chunk, *job))
                if len(pending) >= 2 * workers:
                    _write(fh, h, pending.popleft().result(), bar)
            while pending:
                _write(fh, h, pending.popleft().result(), bar)
            fh.write(bytes(total - fh.tell()))
            bar.update(total - bar.n)
        os.replace(tmp, out)
    finally:
        bar.close()
        tmp.unlink(missing_ok=True)


def _write(fh, h: GGUFHeader, item: tuple[int, np.ndarray], bar) -> None:
    pos, data = item
    gap = h.data_offset + pos - fh.tell()
    if gap:
        fh.write(bytes(gap))
    fh.write(memoryview(data).cast("B"))
    bar.update(gap + data.nbytes)


def _jobs(tensors: list[TensorInfo], seed: int) -> Iterator[tuple]:
    """(tensor, index, chunk number, first unit, units): a unit is a block or a float value."""
    for ti, t in enumerate(tensors):
        q = QUANTS[t.qtype]
        units = t.n_bytes // q.type_size
        step = max(1, CHUNK_BYTES // q.type_size)
        for ci, start in enumerate(range(0, units, step)):
            yield t, (seed, ti, ci), start, min(step, units - start)


def _chunk(t: TensorInfo, key: tuple[int, int, int], start: int, n: int) -> tuple[int, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))
    pos = t.offset + start * QUANTS[t.qtype].type_size
    if t.qtype in _FLOAT_TYPES:
        return pos, _floats(t, n, rng)
    return pos, quant_blocks(t.qtype, n, rng)


def _floats(t: TensorInfo, n: int, rng: np.random.Generator) -> np.ndarray:
    if len(t.ne) == 1 and "norm" in t.name:
        x = np.ones(n, np.float32)
    else:
        std = BIAS_STD if t.name.endswith(".bias") else WEIGHT_STD
        x = rng.standard_normal(n, np.float32) * np.float32(std)
    if t.qtype == QT.BF16:  # round to nearest even on the upper 16 bits
        u = x.view(np.uint32)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(_FLOAT_TYPES[t.qtype], copy=False)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _level_std(levels: int) -> float:
    """Std of a uniform integer on ``levels`` consecutive values."""
    return float(np.sqrt((levels * levels - 1) / 12))


def _signed(rng: np.random.Generator, lo: int, hi: int, shape) -> np.ndarray:
    """Integers with magnitude in [lo, hi) and a random sign (centres one-sided offsets)."""
    return rng.integers(lo, hi, shape) * (rng.integers(0, 2, shape) * 2 - 1)


def quant_blocks(qtype: QT, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random blocks ``(n, type_size)`` whose values have mean ~0 and std ~``WEIGHT_STD``.

    Quant payloads are uniform random bits; scales are set so that min/offset terms centre the
    values. Sub-scales stay small enough that every f16 ``d`` is a normal number.
    """
    q = QUANTS[qtype]
    b = rng.bit_generator.random_raw(-(-n * q.type_size // 8)).view(np.uint8)[:n * q.type_size]
    b = b.reshape(n, q.type_size)
    jit = rng.uniform(0.8, 1.2, n).astype(np.float32)
    sign = rng.integers(0, 2, n).astype(np.float32) * 2 - 1  # ggml's d may be negative
    legacy = {QT.Q4_0: 16, QT.Q4_1: 16, QT.Q5_0: 32, QT.Q5_1: 32, QT.Q8_0: 256}
    if qtype in legacy:
        lv = legacy[qtype]
        d = WEIGHT_STD / _level_std(lv) * jit
        if qtype in (QT.Q4_1, QT.Q5_1):  # x = d*q + m with q in [0, lv): m centres it
            b[:, 2:4] = _f16(-d * (lv - 1) / 2)
        else:  # a random sign centres the half-step offset of q
            d = d * sign
        b[:, 0:2] = _f16(d)
    elif qtype == QT.Q2_K:  # x = d*sc*q - dmin*m, q in 0..3; m = sc, dmin = 1.5 d
        sc = rng.integers(8, 16, (n, 16), dtype=np.uint8)
        b[:, :16] = sc | (sc << 4)
        d = WEIGHT_STD / (11.5 * _level_std(4)) * jit
        b[:, 80:82], b[:, 82:84] = _f16(d), _f16(1.5 * d)
    elif qtype == QT.Q3_K:  # x = d*(s-32)*q, q in -4..3, s 6-bit packed, s-32 = ±[8, 16)
        s = (32 + _signed(rng, 8, 16, (n, 16))).astype(np.uint8)
        b[:, 96:104] = (s[:, :8] & 0xF) | ((s[:, 8:] & 0xF) << 4)
        hi = (s >> 4).reshape(n, 4, 4)  # scale 4*g + k -> byte 8 + k, bits 2g
        b[:, 104:108] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
        b[:, 108:110] = _f16(WEIGHT_STD / (11.5 * _level_std(8)) * jit)
    elif qtype in (QT.Q4_K, QT.Q5_K):  # x = d*sc*q - dmin*m; m = sc centres q
        lv, (lo, hi_) = (16, (16, 32)) if qtype == QT.Q4_K else (32, (8, 16))
        sc = rng.integers(lo, hi_, (n, 8), dtype=np.uint8)
        b[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
        b[:, 8:12] = b[:, 4:8]  # mins equal the scales
        b[:, 12:16] = (sc[:, 4:] & 0xF) | ((sc[:, 4:] & 0xF) << 4)
        d = WEIGHT_STD / ((lo + hi_ - 1) / 2 * _level_std(lv)) * jit
        b[:, 0:2], b[:, 2:4] = _f16(d), _f16(d * (lv - 1) / 2)
    elif qtype == QT.Q6_K:  # x = d*sc*(q-32), int8 sc
        b[:, 192:208] = _signed(rng, 4, 12, (n, 16)).astype(np.int8).view(np.uint8)
        b[:, 208:210] = _f16(WEIGHT_STD / (7.5 * _level_std(64)) * jit)
    else:
        raise KeyError(f"cannot synthesize tensor type {qtype.name}")
    return b


# -- tiny models, for tests ---------------------------------------------------------------------

def tiny_layout(arch: str = "qwen2", qtype: QT = QT.Q8_0, *, n_layers: int = 2, n_embd: int = 256,
                n_heads: int = 4, n_kv_heads: int = 2, n_ff: int = 512
                ) -> tuple[dict[str, Any], list[tuple[str, QT, tuple[int, ...]]]]:
    """Metadata and tensor table of a small model (byte-level gpt2 vocabulary + 3 merges).

    Edit either before :func:`write_layout` to build broken files for tests.
    """
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs + [256 + i for i in range(256 - len(bs))]
    byte_tokens = [chr(c) for b_, c in sorted(zip(bs + [b for b in range(256) if b not in bs], cs))]
    tokens = byte_tokens + ["Ġt", "he", "Ġthe", "<|endoftext|>"]
    hd = n_embd // n_heads
    md: dict[str, Any] = {
        "general.architecture": arch, "general.name": f"tiny {arch} {qtype.name}",
        f"{arch}.block_count": n_layers, f"{arch}.context_length": 512,
        f"{arch}.embedding_length": n_embd, f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_heads, f"{arch}.attention.head_count_kv": n_kv_heads,
        f"{arch}.rope.freq_base": 10000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2" if arch == "qwen2" else "smollm",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3],
        "tokenizer.ggml.merges": ["Ġ t", "h e", "Ġt he"],
        "tokenizer.ggml.eos_token_id": len(tokens) - 1, "tokenizer.ggml.bos_token_id": len(tokens) - 1,
    }
    e, qd, kvd, v = n_embd, n_heads * hd, n_kv_heads * hd, len(tokens)
    ts: list[tuple[str, QT, tuple[int, ...]]] = [("token_embd.weight", qtype, (v, e))]
    for i in range(n_layers):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight", QT.F32, (e,)), (p + "attn_q.weight", qtype, (qd, e)),
               (p + "attn_k.weight", qtype, (kvd, e)), (p + "attn_v.weight", qtype, (kvd, e))]
        if arch == "qwen2":
            ts += [(p + "attn_q.bias", QT.F32, (qd,)), (p + "attn_k.bias", QT.F32, (kvd,)),
                   (p + "attn_v.bias", QT.F32, (kvd,))]
        ts += [(p + "attn_output.weight", qtype, (e, qd)), (p + "ffn_norm.weight", QT.F32, (e,)),
               (p + "ffn_gate.weight", qtype, (n_ff, e)), (p + "ffn_up.weight", qtype, (n_ff, e)),
               (p + "ffn_down.weight", qtype, (e, n_ff))]
    ts += [("output_norm.weight", QT.F32, (e,)), ("output.weight", qtype, (v, e))]
    return md, ts


def write_layout(path: Path, metadata: dict[str, Any], tensors: list[tuple[str, QT, tuple[int, ...]]]) -> None:
    """Write a header-only GGUF (a layout template) with ``gguf.GGUFWriter``; shapes are torch order.
    Ints are written as UINT32, floats as FLOAT32, int lists as INT32 arrays."""
    w = GGUFWriter(path, str(metadata.get("general.architecture", "")))
    for k, v in metadata.items():
        if k == "general.architecture":
            continue
        vt = (VT.BOOL if isinstance(v, bool) else VT.UINT32 if isinstance(v, int) else
              VT.FLOAT32 if isinstance(v, float) else VT.STRING if isinstance(v, str) else VT.ARRAY)
        w.add_key_value(k, v, vt)
    for name, qt, shape in tensors:
        q = QUANTS[qt]
        n_bytes = int(np.prod(shape[:-1], dtype=np.int64)) * q.row_bytes(shape[-1])
        w.add_tensor_info(name, shape, np.dtype(np.float32), n_bytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
