"""Inner-loop size of mmq_triton kernels, compiled for sm_90 on any machine (no GPU needed).

    python benchmarks/sass_loop.py [--n 37888 --nt 28] [--configs 8,4,4 16,2,2 ...]
    python benchmarks/sass_loop.py --fused [--configs 16,32,4 64,64,4 ...] [--q6] [--decode float32|bf16x2] [--swap]
    python benchmarks/sass_loop.py --ws [--q6]
    python benchmarks/sass_loop.py --attn [--configs 64,4,3 64,4,1 128,8,3 ...]

Default, the q4_K int8 decode GEMV: for each ``BN,S,num_warps`` (S = 128-value spans per step) the
instructions in the main loop's body, its global loads and dp4a instructions, registers per thread,
and instructions per weight byte per thread. ``--fused``: the fused plane GEMM (prefill and the
batched engine's row tiles) for each ``BLOCK_M,BLOCK_N,num_warps``: instructions, global loads and
tensor-core MMAs per K step (one span: 128 values of q4_K, 256 of q6_K), and instructions per weight
per thread. ``--ws``: the warp-specialized GEMM's memory, barrier, fence and MMA instructions in
program order (where its proxy fence's ``MEMBAR`` lands against the loads ahead). ``--attn``: the
decode attention's split kernel (RoPE on, the 7B's heads) for each ``BLOCK_S,num_warps,num_stages``,
and its combine: registers, spilled stack, shared memory, ``cp.async`` copies (a pipelined loop) and
global loads. The kernel is
specialized the way Triton specializes it at a launch (pointers and sizes divisible by 16 marked so),
with ptxas and cuobjdump from the triton wheel.
"""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

from minfer_mmq_triton import tiles
from minfer_mmq_triton.prefill import gemm_planes
from minfer_mmq_triton.q4_k import gemv as q4k_gemv

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
INT_PTRS = {"qw_ptr", "sc_ptr", "dm_ptr", "xh_ptr", "xl_ptr", "cnt_ptr"}


def compile_sass(fn, consts: dict, sizes: dict, warps: int, ptr_types: dict | None = None, types: dict | None = None,
                 **options) -> tuple[str, int]:
    """SASS and registers per thread; pointers are ``*i32`` (INT_PTRS), ``ptr_types[name]``, else ``*fp32``;
    ``types``: any argument's type by name (a Gluon tensor descriptor's); a Gluon kernel compiles as one;
    ``options``: more compiler options (``maxnreg``, ``num_stages``)."""
    sass, usage, _ = compile_usage(fn, consts, sizes, warps, ptr_types, types, **options)
    return sass, usage["REG"]


def compile_usage(fn, consts: dict, sizes: dict, warps: int, ptr_types: dict | None = None,
                  types: dict | None = None, **options) -> tuple[str, dict, dict]:
    """:func:`compile_sass`'s SASS, cuobjdump's resource usage (``REG``, ``STACK`` bytes a thread, ...)
    and the compiled kernel's metadata (``shared`` bytes, ``num_stages``)."""
    names = list(inspect.signature(fn.fn).parameters)
    sig = {}
    for n in names:
        if n in consts:
            sig[n] = "constexpr"
        elif n in (types or {}):
            sig[n] = types[n]
        elif n.endswith("_ptr"):
            sig[n] = (ptr_types or {}).get(n) or ("*i32" if n in INT_PTRS else "*fp32")
        else:
            sig[n] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or sizes.get(n, 1) % 16 == 0}
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else triton.compiler.ASTSource
    src = source(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    options = dict(num_warps=warps, num_stages=3) | options
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    cubin = Path("/tmp/minfer_sass_loop.cubin")
    cubin.write_bytes(c.asm["cubin"])
    sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    res = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", res.splitlines()[-1])}
    return sass, usage, {"shared": c.metadata.shared, "num_stages": options["num_stages"]}


def loop_body(sass: str) -> list[str]:
    """The instructions between the first backward branch's target and the branch."""
    lines = [(int(m.group(1), 16), line) for line in sass.splitlines()
             if (m := re.search(r"/\*([0-9a-f]{4})\*/", line))]
    for addr, line in lines:
        m = re.search(r"BRA 0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            return [ln for a, ln in lines if start <= a <= addr]
    return []


def fused(configs: list[str], q6: bool, decode: str | None = None, swap: bool = False) -> None:
    """The fused plane GEMM's K-step loop per ``BLOCK_M,BLOCK_N,num_warps`` (q4_K, or q6_K)."""
    # q4_K: qs, sc | m (int16 a sub-block), d | dmin (int32 a block); q6_K: ql, qh, scales (float16)
    ptrs = {"a_ptr": "*bf16", "p0_ptr": "*u8", "p1_ptr": "*u8" if q6 else "*i16", "p2_ptr": "*fp16" if q6 else "*i32",
            "cnt_ptr": "*i32"}
    span = 256 if q6 else 128
    for cfg in configs:
        bm, bn, warps = (int(v) for v in cfg.split(","))
        consts = dict(WTYPE=int(q6), HAS_BIAS=False, DOT_F32=False, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, SPLIT=1,
                      AHEAD=not q6 and tiles.fused_ahead(bm),
                      PACKED=not q6 and (tiles.fused_bf16_decode(bm) if decode is None else decode == "bf16x2"),
                      SWAP=swap)
        # the 7B's gate|up at a full row tile (K = 3584)
        sizes = dict(M=bm, N=37888, K=3584, stride_am=3584, stride_p0=1792, stride_p1=896 if q6 else 112,
                     stride_p2=224 if q6 else 14, stride_cm=37888)
        sass, regs = compile_sass(gemm_planes._gemm_planes_kernel, consts, sizes, warps, ptrs)
        body = loop_body(sass)
        weights = bn * span / (warps * 32)  # weights per thread per K step
        print(f"fused {'q6_K' if q6 else 'q4_K'} BLOCK_M={bm} BLOCK_N={bn} warps={warps}: {len(body)} instructions "
              f"per K step ({weights:.0f} weights a thread), {sum('LDG' in x for x in body)} LDG, "
              f"{sum('MMA' in x for x in body)} MMA, {regs} registers, {len(body) / weights:.1f} instructions per weight"
              + (" (scales a step ahead)" if consts["AHEAD"] else "")
              + ("" if q6 else f", q4_K decoded in {'bf16x2' if consts['PACKED'] else 'float32'}")
              + f", {sum('HGMMA' in x for x in body)} of them wgmma" + (", swapped" if swap else ""))


def ws(q6: bool) -> None:
    """The warp-specialized GEMM (``prefill.gemm_wgmma_ws``) at the routed tile: its global loads, shared
    stores, barriers, fences and MMAs in program order (repeats folded), to see what a fence waits for.
    Gluon kernels compile with the device's triton only (3.6 there; later Gluon APIs differ)."""
    from minfer_mmq_triton.prefill import gemm_wgmma_ws as W

    na, wg, stages, p, regs = tiles.WS_TILE
    consts = dict(DL=W._decode_layout(64 * wg, p), WG=wg, STAGES=stages, P=p, REGS=regs, WTYPE=int(q6), SPLIT=1,
                  HAS_BIAS=False, HAS_RES=False, PDL=False)
    sass, _ = compile_sass(W._gemm_ws_kernel, consts, {}, 4 * wg, {"w0_ptr": "*u8", "w1_ptr": "*u8", "w2_ptr": "*i32"},
                           {"x_desc": f"tensordesc<fp16[{na},64],{W._X_LAYOUT!r}>"}, maxnreg=W.max_regs(wg, p))
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+ )?(LDG\S*|STS\S*|MEMBAR\S*|FENCE\S*|BAR\.SYNC\S*"
                     r"|SYNCS\.\w+|UTMALDG\S*|HGMMA\S*)", sass)
    runs: list[list] = []
    for op in ops:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    print(f"warp-specialized {'q6_K' if q6 else 'q4_K'} tile {tiles.WS_TILE}: {sass.count('MEMBAR')} MEMBAR")
    print(" ".join(op if n == 1 else f"{op}x{n}" for op, n in runs))


def attn(configs: list[str]) -> None:
    """The decode attention's two kernels (``ops.attention``) at the 7B's heads (28 query heads over 4 KV heads
    of 128), specialized as a launch is: the caches' row strides (512, 128 values) divisible by 16."""
    from minfer_mmq_triton.ops import attention as A

    ptrs = {"k_ptr": "*fp16", "v_ptr": "*fp16", "nv_ptr": "*i32", "xh_ptr": "*i8", "xl_ptr": "*i8"}
    sizes = dict(stride_kt=512, stride_kh=128, stride_vt=512, stride_vh=128)
    types = {"qk_scale": "fp32"}
    nsplit = 32  # A.n_splits on a 132-multiprocessor H200
    for cfg in configs:
        bs, warps, stages = (int(v) for v in cfg.split(","))
        consts = dict(REP=7, REP_P=16, D=128, DP=128, BLOCK_S=bs, NSPLIT=nsplit, PDL=True, ROPE=1)
        sass, usage, meta = compile_usage(A._attn_split_kernel, consts, sizes, warps, ptrs, types, num_stages=stages)
        print(f"split BLOCK_S={bs} warps={warps} stages={stages}: {usage['REG']} registers, {usage['STACK']} bytes "
              f"of stack, {meta['shared']} bytes of shared memory, {sass.count('LDGSTS')} cp.async (LDGSTS), "
              f"{sass.count('LDG.')} other global loads")
    consts = dict(H=28, D=128, DP=128, DC=32, NSPLIT=nsplit, BLOCK_S=64, CH=32, PDL=True, FORM=True)
    sass, usage, meta = compile_usage(A.attn_combine_kernel, consts, {}, 4, ptrs)
    print(f"combine DC=32 CH=32 warps=4: {usage['REG']} registers, {usage['STACK']} bytes of stack, "
          f"{meta['shared']} bytes of shared memory, {sass.count('LDG.')} global loads")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=37888, help="rows (default: the 7B's gate|up)")
    ap.add_argument("--nt", type=int, default=28, help="128-value spans per row (K / 128)")
    ap.add_argument("--configs", nargs="+", default=None,
                    help="GEMV: BN,S,num_warps (default 8,4,4 16,2,2 16,4,4 32,4,4); --fused: BLOCK_M,BLOCK_N,num_warps")
    ap.add_argument("--fused", action="store_true", help="the fused plane GEMM instead of the int8 GEMV")
    ap.add_argument("--q6", action="store_true", help="with --fused: the q6_K kernel")
    ap.add_argument("--decode", choices=("float32", "bf16x2"), default=None,
                    help="with --fused: q4_K's decode (default: the tile's, tiles.fused_bf16_decode)")
    ap.add_argument("--swap", action="store_true", help="with --fused: the weight tile as the MMA's A operand")
    ap.add_argument("--ws", action="store_true", help="the warp-specialized GEMM's loads, barriers and fences in order")
    ap.add_argument("--attn", action="store_true",
                    help="the decode attention's kernels (--configs BLOCK_S,num_warps,num_stages; default 64,4,3)")
    args = ap.parse_args()
    if args.attn:
        return attn(args.configs or ["64,4,3"])
    if args.ws:
        return ws(args.q6)
    if args.fused:
        return fused(args.configs or ["16,32,4", "16,64,4", "64,64,4"], args.q6, args.decode, args.swap)
    args.configs = args.configs or ["8,4,4", "16,2,2", "16,4,4", "32,4,4"]
    sizes = dict(N=args.n, NT=args.nt, stride_ym=args.n, stride_bm=args.n)
    for cfg in args.configs:
        bn, s, warps = (int(v) for v in cfg.split(","))
        consts = dict(HAS_BIAS=True, EVEN=True, BN=bn, S=s, SPLIT=1, USE_ASM=True, PDL=False, PF=0)
        sass, regs = compile_sass(q4k_gemv._gemv_q4p_i8_kernel, consts, sizes, warps)
        body = loop_body(sass)
        words = bn * s * 16 / (warps * 32)  # 32-bit weight words per thread per step
        print(f"q4_K int8 BN={bn} S={s} warps={warps}: {len(body)} instructions per step, "
              f"{sum('LDG' in x for x in body)} LDG, {sum('IDP' in x for x in body)} dp4a, {regs} registers, "
              f"{len(body) / (4 * words):.2f} instructions per weight byte")


if __name__ == "__main__":
    main()
