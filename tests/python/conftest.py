"""Makes the package importable from the source tree: python/ goes on sys.path unless mla_decode is
installed, and the module is found as mla_decode/_lib.py describes (MLA_DECODE_LIBRARY, or
build/libmla_decode_ffi.so from scripts/build.sh)."""

import importlib.util
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

_SOURCE = Path(__file__).resolve().parents[2] / "python"
if importlib.util.find_spec("mla_decode") is None:
    sys.path.insert(0, str(_SOURCE))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's name, so every test draws fresh but reproducible data."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
