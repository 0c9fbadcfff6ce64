"""Locating and loading the tvm-ffi module, libmla_decode_ffi.so (built from src/python/).

Looked up, first match wins:
  1. the path in the environment variable MLA_DECODE_LIBRARY;
  2. next to this file (an installed wheel puts it there);
  3. <repository>/build/ (scripts/build.sh's build tree, when importing from a source checkout).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import tvm_ffi

LIBRARY_ENV = "MLA_DECODE_LIBRARY"
LIBRARY_NAME = "libmla_decode_ffi.so"


def library_path() -> Path:
    """The module file this package loads (see the module docstring for the search order)."""
    given = os.environ.get(LIBRARY_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ImportError(f"{LIBRARY_ENV}={given}: no such file")
        return path
    here = Path(__file__).resolve().parent
    candidates = [here / LIBRARY_NAME, here.parents[1] / "build" / LIBRARY_NAME]
    for path in candidates:
        if path.is_file():
            return path
    raise ImportError(
        f"mla_decode: {LIBRARY_NAME} not found (looked in {', '.join(map(str, candidates))}); "
        f"install the package (pip install .), run scripts/build.sh, or set {LIBRARY_ENV}"
    )


@functools.lru_cache(maxsize=None)
def lib() -> Any:
    """The loaded module: workspace_size, plan, run, decode (the entry points), merge_states,
    peer_exchange and peer_exchange_buffer_bytes, backend_available, launch_stream (see
    src/python/binding.cc)."""
    return tvm_ffi.load_module(str(library_path()))
