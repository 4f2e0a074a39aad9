"""mmq_triton tests: on a machine without CUDA the kernels run under Triton's CPU interpreter.

``TRITON_INTERPRET`` must be set before the first kernel launch; the kernel modules are imported
inside the tests, after this file ran.
"""

import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # mmq_synth
sys.path.insert(0, str(HERE.parent))  # minfer_mmq_triton, when the plugin is not installed
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ALL_GATES = ("MINFER_MMQ", "MINFER_MMQ_RAW", "MINFER_MMQ_RAW_NB", "MINFER_MMQ_A_TRANSPOSE",
             "MINFER_MMQ_Q6K_NB", "MINFER_MMQ_Q6K_EXP", "MINFER_MMQ_Q4K_DSC")


@pytest.fixture
def make_ctx():
    """A LoadContext on the test device with every gate on unless overridden (names -> values)."""
    from minfer_core.weights import LoadContext

    def make(device=None, fuse_mode=2, **over):
        gates = {g: True for g in ALL_GATES}
        gates["MINFER_MMQ_A_FUSE"] = 2
        gates.update(over)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        cc = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
        return LoadContext(device=dev, compute_capability=cc, gates=gates, fuse_mode=fuse_mode)
    return make
