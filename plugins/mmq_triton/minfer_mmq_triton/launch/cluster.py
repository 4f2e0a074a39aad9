"""Split-K reduced inside a thread-block cluster (compute capability 9.0+): the tensor-core GEMVs' tail
without the L2 round trips of :func:`launch.split.store_rows`.

There a split stores its partial row sums to global memory, counts itself in on an arrival atomic,
and the last to arrive reloads every partial: three dependent trips to L2 after the loop. Here the
``SPLIT`` programs of a row block are one cluster (``launch_split``): each writes its partial to
its own shared memory, the cluster meets at a barrier (release / acquire), and rank 0 reads the
partials over distributed shared memory in the fixed order ``s = 0, 1, ...`` (the same float sums, so
the same bits, as ``store_rows``) and stores ``y``; a second barrier keeps the others' shared memory
alive until it has. No scratch, no counter.

The partials live in ``EXTRA`` bytes of dynamic shared memory past what Triton allocated: the launch
asks for them, and the kernel finds them from ``%dynamic_smem_size``. Triton compiles the kernel for
one CTA (``program_id(0)`` is the CTA index), and its launcher, given a cluster size in the kernel's
packed metadata, launches ``grid[0] * SPLIT`` CTAs in clusters of ``SPLIT`` along x: program
``(pid, s)`` is CTA ``pid * SPLIT + s``, ``s`` its rank in the cluster (:func:`split_ids`).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .split import store_rows

#: The cluster sizes launched (8 is the portable maximum).
MAX_CLUSTER = 8

_BARRIER = gl.constexpr("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                        "mov.u32 $0, 0;")


@gluon.constexpr_function
def _smem_asm(extra, split):
    """PTX over ``$1`` (an element's index in the partials) and, with ``split == 0``, ``$2`` (its value):
    store the value into this CTA's partials; else ``$0`` = the sum of the ``split`` CTAs' values at that
    index, in rank order."""
    base = ("mov.u32 b, global_smem; mov.u32 d, %dynamic_smem_size; add.u32 b, b, d; "
            f"sub.u32 b, b, {extra}; mad.lo.u32 b, $1, 4, b;")
    if split == 0:
        return "{ .reg .u32 b, d; " + base + " st.shared.f32 [b], $2; mov.u32 $0, 0; }"
    loads = " ".join(f"mapa.shared::cluster.u32 r, b, {t}; ld.shared::cluster.f32 v{t}, [r];" for t in range(split))
    adds = " ".join(f"add.f32 $0, $0, v{t};" for t in range(1, split))
    regs = ", ".join(f"v{t}" for t in range(split))
    return "{ .reg .u32 b, d, r; .reg .f32 " + regs + "; " + base + " " + loads + " mov.f32 $0, v0; " + adds + " }"


@gluon.jit
def split_ids(SPLIT: gl.constexpr, CLUSTER: gl.constexpr):
    """``(pid, s)``: this program's row block and split: its rank in the cluster under CLUSTER, else
    ``program_id(1)`` (grid ``(row blocks, SPLIT, M)``)."""
    if CLUSTER:
        c = gl.program_id(0)
        return c // SPLIT, c % SPLIT
    else:
        return gl.program_id(0), gl.program_id(1)


@gluon.jit
def _one_a_thread():
    """Zeros, one element a thread; passed through shared memory, so that the kernel declares Triton's
    shared-memory base (``global_smem``, which the partials' PTX names) even where it uses none else."""
    W: gl.constexpr = gl.num_warps()
    L: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
    zero = gl.full([32 * W], 0, gl.int32, layout=L)
    return gl.allocate_shared_memory(gl.int32, [32 * W], gl.SwizzledSharedLayout(1, 1, 1, [0]), zero).load(L)


@gluon.jit
def cluster_barrier(one):
    """Every thread of every CTA of the cluster (``one``: :func:`_one_a_thread`): writes before it are
    seen by reads after it."""
    gl.inline_asm_elementwise(_BARRIER, "=r,r", [one], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_sum(y, r, s, EXTRA: gl.constexpr, SPLIT: gl.constexpr):
    """The sum over the cluster's ``SPLIT`` programs of their ``y`` (float32, any layout; ``r`` the
    element's index in ``[0, EXTRA / 4)``, equal across programs), added in rank order; valid in rank 0
    (``s == 0``) alone, which must call it while the others call it too."""
    one = _one_a_thread()
    gl.inline_asm_elementwise(_smem_asm(EXTRA, 0), "=r,r,r", [r, y], dtype=gl.int32, is_pure=False, pack=1)
    cluster_barrier(one)
    tot = y
    if s == 0:
        tot = gl.inline_asm_elementwise(_smem_asm(EXTRA, SPLIT), "=r,r", [r], dtype=gl.float32, is_pure=False,
                                        pack=1)
    cluster_barrier(one)  # rank 0 has read every partial: the others' shared memory may go
    return tot


@gluon.jit
def store_split_rows(y, rows, N, xm, pid, s, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
                     HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, CLUSTER: gl.constexpr, BN: gl.constexpr):
    """:func:`launch.split.store_rows` of a program's row sums ``y`` (its ``BN`` rows from ``pid * BN``), or
    with CLUSTER their sum over the cluster, stored by rank 0."""
    if CLUSTER:
        y = cluster_sum(y, rows - pid * BN, s, 4 * BN, SPLIT)
        if s == 0:
            store_rows(y, rows, N, xm, pid, 0, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
                       HAS_BIAS, 1)
    else:
        store_rows(y, rows, N, xm, pid, s, y_ptr, stride_ym, bias_ptr, stride_bm, part_ptr, cnt_ptr, n_blocks,
                   HAS_BIAS, SPLIT)


def launch_split(kernel, n_blocks: int, split: int, m: int, rows: int, cluster: bool, *args, **kwargs):
    """A split GEMV ``kernel`` of ``rows`` weight rows a program: grid ``(n_blocks, split, m)``, or with
    ``cluster`` (and ``split > 1``) ``CLUSTER=True`` over ``n_blocks * split`` CTAs in clusters of ``split``
    along x, each with ``4 rows`` more bytes of dynamic shared memory for its partials (see the module
    docstring). A cluster launch first looks the compiled kernel up (Triton's ``warmup``: its argument
    binding a second time, host time only, none in a replayed CUDA graph), so that a new specialization
    is set up before it is ever launched."""
    if not cluster or split == 1:
        kernel[(n_blocks, split, m)](*args, **kwargs)
        return
    assert split <= MAX_CLUSTER
    grid = (n_blocks, 1, m)
    kwargs["CLUSTER"] = True
    ck = kernel.warmup(*args, grid=grid, **kwargs)  # compiles (once) without launching
    ck = ck.result() if hasattr(ck, "result") else ck  # under asynchronous compilation
    want = getattr(ck, "minfer_cluster", None)
    if want is None:
        nw, ctas, shared = ck.packed_metadata
        assert ctas == 1 and 0 < shared, "a cluster launch needs a one-CTA kernel that uses shared memory"
        total = -(-shared // 16) * 16 + 4 * rows
        assert total <= 48 << 10, "more dynamic shared memory than a launch gets without opting in"
        ck.packed_metadata = (nw, split, total)
        ck.minfer_cluster = want = split
    assert want == split, "one compiled kernel, one cluster size"
    kernel[grid](*args, **kwargs)
