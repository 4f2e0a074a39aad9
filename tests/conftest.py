"""Shared fixtures: the real models, fetched the way a user's first run fetches them."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under the CPU interpreter in CI; the variable must be set before triton
    # is first imported anywhere in the session.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minfer_core.fetch import pull


@pytest.fixture(scope="session")
def qwen_path():
    return pull("qwen2.5-coder-0.5b", quiet=True)


@pytest.fixture(scope="session")
def smollm_path():
    return pull("smollm2-135m", quiet=True)
