"""Hook implementations only; the kernel lives in :mod:`minfer_example_plugin.q8_0`.

The plugin serves Q8_0 matmuls (both phases) with the label ``example.q8_0``. Installing it
changes nothing until a policy places ``example`` in an ``order`` list (or ``--backend example``).
It declares one gate of its own, ``MINFER_EXAMPLE_Q8``: ``MINFER_EXAMPLE_Q8=0`` turns it off for
a run (``gates.example.MINFER_EXAMPLE_Q8: off`` in a policy, for good); ``minfer gates`` lists it.
"""

from minfer_core.hookspecs import hookimpl
from minfer_core.weights import Candidate, Gate

NAME = "example"  # must equal the entry-point name in pyproject.toml
GATE = "MINFER_EXAMPLE_Q8"
LABEL = "example.q8_0"


@hookimpl
def minfer_gates():
    return [Gate(GATE, True, f"Q8_0 matmuls run on the example plugin's int8 plane ({LABEL})",
                 "the example plugin offers nothing; the policy's next plugin serves Q8_0", labels=(LABEL,))]


@hookimpl
def minfer_applicable(ctx):
    return None  # plain torch: runs on any device


@hookimpl
def minfer_register_weight(weight, ctx):
    from . import q8_0

    if ctx.gates.get(GATE, True) and q8_0.serves(weight) and weight.raw is not None:
        weight.planes[q8_0.PLANE] = q8_0.build_plane(weight.raw, weight.n_in)


@hookimpl
def minfer_matmul_candidates(weight, phase, ctx):
    from . import q8_0

    if not ctx.gates.get(GATE, True) or not q8_0.serves(weight):
        return None
    return [Candidate(NAME, LABEL, q8_0.matmul_fn(weight), GATE)]
