"""SwiGLU where a float decode GEMV loads x, so that no separate launch has to (``SWIGLU``).

With ``SWIGLU`` the activation row is ``[g | u]`` (``2K`` values) and the kernel multiplies
``silu(g) * u`` as it loads each tile; ffn_down then needs no launch of its own for the
activation. The int8 GEMVs do the same (and RMSNorm) in the kernel that quantizes x
(``ops.quant_x``). RMSNorm is not fused here: every program would sum the squares of the whole
row, which costs more than the one launch it saves.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_x(x_row, off, K, mask, SWIGLU: tl.constexpr):
    """The activations at offsets ``off`` (``mask``: None, or 0 where False): x, or with SWIGLU
    ``silu(g) * u`` of the row ``[g | u]``."""
    if mask is None:
        x = tl.load(x_row + off)
        if SWIGLU:
            x = x * tl.sigmoid(x) * tl.load(x_row + K + off)
    else:
        x = tl.load(x_row + off, mask=mask, other=0.0)
        if SWIGLU:
            x = x * tl.sigmoid(x) * tl.load(x_row + K + off, mask=mask, other=0.0)
    return x
