#!/usr/bin/env bash
# Builds, then runs the whole test suite (CTest: oracle, cpu backend, validation, README example),
# then the Python package's tests (pytest, tests/python) against the module in build/.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# NOTE: tests on explicitly: a build/ configured without them (a bench-only build) would otherwise
# leave CTest nothing to run, which must fail, not pass.
bash "$root/scripts/build.sh" -DMLA_BUILD_TESTS=ON
cd "$root/build"
ctest --output-on-failure --no-tests=error -j "$(nproc)"
cd "$root"
MLA_DECODE_LIBRARY="$root/build/libmla_decode_ffi.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  "${MLA_PYTHON:-$root/.deps/venv/bin/python}" -m pytest tests/python -q
