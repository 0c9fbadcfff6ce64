"""The GPU tests' precondition: PyTorch, a compute-capability 9.0 GPU and the sm90 backend."""

from __future__ import annotations

import pytest

import mla_decode


def require_sm90():
    """PyTorch where the sm90 backend can run; otherwise skips the calling test module."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device", allow_module_level=True)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("not a compute-capability 9.0 GPU", allow_module_level=True)
    if "sm90" not in mla_decode.available_backends():
        pytest.skip("this build has no sm90 backend", allow_module_level=True)
    return torch
