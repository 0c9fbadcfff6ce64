#!/usr/bin/env bash
# Builds, then runs the whole test suite (CTest: oracle, cpu backend, validation, README example).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)"
