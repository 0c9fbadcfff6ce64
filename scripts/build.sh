#!/usr/bin/env bash
# Installs the pinned dependencies (scripts/setup_deps.sh) and builds the project into build/.
# Extra arguments go to CMake's configure step, e.g. -DMLA_CUTLASS_DIR=/path/to/cutlass.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup_deps.sh
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# The Python package's module is built against apache-tvm-ffi from the pinned .deps/venv (or the
# interpreter named by MLA_PYTHON, see setup_deps.sh).
python="${MLA_PYTHON:-$root/.deps/venv/bin/python}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMLA_ENABLE_CUDA="$cuda" \
  -DMLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$python" "$@" >/dev/null
cmake --build build -j "$(nproc)"
