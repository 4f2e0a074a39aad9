"""Hook implementations only; the kernel lives in :mod:`minfer_example_plugin.q8_0`.

The plugin serves Q8_0 matmuls (both phases) with the label ``example.q8_0``. Installing it
changes nothing until a policy places ``example`` in an ``order`` list (or ``--backend example``).
"""

from minfer_core.hookspecs import hookimpl
from minfer_core.weights import Candidate

NAME = "example"  # must equal the entry-point name in pyproject.toml


@hookimpl
def minfer_applicable(ctx):
    return None  # plain torch: runs on any device


@hookimpl
def minfer_register_weight(weight, ctx):
    from . import q8_0

    if q8_0.serves(weight) and weight.raw is not None:
        weight.planes[q8_0.PLANE] = q8_0.build_plane(weight.raw, weight.n_in)


@hookimpl
def minfer_matmul_candidates(weight, phase, ctx):
    from . import q8_0

    if not q8_0.serves(weight):
        return None
    return [Candidate(NAME, "example.q8_0", q8_0.matmul_fn(weight))]
