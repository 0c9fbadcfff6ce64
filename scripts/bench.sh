#!/usr/bin/env bash
# The main job: builds the library and mla-bench only (no tests, no Python module) into
# build-bench/, then runs one DeepSeek-V3-shaped decode step on the best available backend.
# Arguments go to mla-bench (scripts/bench.sh --help lists them). The build's output goes to stderr,
# so stdout holds only the benchmark's report (with --json: JSON lines).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
dir="$root/build-bench"
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
  export PATH="$PATH:/usr/local/cuda/bin"
fi
# Device code needs the pinned CUTLASS headers (scripts/setup_deps.sh installs them); a cpu-only
# build needs nothing from .deps/.
if [ "$cuda" = ON ] && [ ! -f "$root/.deps/cutlass/include/cute/tensor.hpp" ]; then
  bash scripts/setup_deps.sh >&2
fi
mkdir -p "$dir"
[ -f "$dir/.gitignore" ] || echo '*' >"$dir/.gitignore"  # a build tree: never part of the checkout
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMLA_ENABLE_CUDA="$cuda" -DMLA_BUILD_BENCH=ON \
  -DMLA_BUILD_TESTS=OFF -DMLA_BUILD_PYTHON=OFF >/dev/null
cmake --build "$dir" -j "$(nproc)" --target mla-bench >&2
exec "$dir/mla-bench" "$@"
