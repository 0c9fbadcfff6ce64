#!/usr/bin/env bash
# The main job: builds, then runs one DeepSeek-V3-shaped decode step on the best available backend.
# Arguments go to mla-bench (see build/mla-bench --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/build.sh"
exec "$root/build/mla-bench" "$@"
