#!/usr/bin/env bash
# Builds, then runs the whole test suite (CTest: oracle, cpu backend, validation, README example),
# then the Python package's tests (pytest, tests/python) against the module in build/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)"
cd "$root"
MLA_DECODE_LIBRARY="$root/build/libmla_decode_ffi.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  "${MLA_PYTHON:-$root/.deps/venv/bin/python}" -m pytest tests/python -q
