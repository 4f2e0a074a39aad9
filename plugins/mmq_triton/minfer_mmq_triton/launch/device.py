"""What a launch needs to know of the device, read once per device."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (4 off CUDA, where the interpreter runs the kernels)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
