#!/usr/bin/env bash
# The GPU check, for a machine with a Hopper GPU: builds with CUDA, runs the whole suite (CTest,
# then pytest with the PyTorch GPU tests), then compute-sanitizer's memcheck, racecheck, synccheck
# and initcheck over the sm90 tests, and prints one summary line per step.
#
#   scripts/gpu_check.sh [LOG_DIR]        logs go to LOG_DIR (default: build/gpu-check)
#
# Environment:
#   MLA_PYTHON              interpreter with PyTorch, apache-tvm-ffi, numpy, ml_dtypes and pytest
#                           (default: python3); the module is built against its apache-tvm-ffi
#   MLA_SANITIZE_FILTER     gtest filter of the sm90 tests the sanitizers run (default below: every
#                           kernel and route at small sizes; '*' runs all, which takes long)
#   MLA_SANITIZE_SPARSE_FILTER  the same for tests/sm90/sparse_test.cc (default: every format on
#                           both kernels, the block and split cases, NaN propagation)
#   MLA_SANITIZE_FP8_FILTER the same for the decode tests over e4m3 caches (default: the few-rows
#                           kernel's routes, the FP8 seesaw kernel on both layouts and the widened
#                           ring), run apart from the filter above so that each stays within the
#                           timeout
#   MLA_SANITIZE_TOOLS      the tools to run (default: memcheck racecheck synccheck initcheck)
#   MLA_SANITIZE_TIMEOUT    seconds each tool may take (default 300)
# Needs .deps/cutlass and .deps/googletest (scripts/setup_deps.sh, or copies of them). Exits 1 when
# any step fails.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
logs=${1:-$root/build/gpu-check}
python=${MLA_PYTHON:-python3}
mkdir -p "$logs"
summary=()
failed=0
note() { summary+=("$1"); echo "gpu_check: $1" >&2; }

# ---- build ----
export PATH="$PATH:/usr/local/cuda/bin"
if ! { cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DMLA_ENABLE_CUDA=ON \
  -DMLA_BUILD_TESTS=ON -DMLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$python")" &&
  cmake --build "$root/build" -j "$(nproc)"; } >"$logs/build.log" 2>&1; then
  note "build: FAILED (see $logs/build.log)"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
note "build: ok"

# ---- the suite ----
(cd "$root/build" && ctest --output-on-failure -j 4) >"$logs/ctest.log" 2>&1
rc=$?
note "ctest: $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1) (rc $rc)"
[ $rc -eq 0 ] || failed=1
MLA_DECODE_LIBRARY="$root/build/libmla_decode_ffi.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m pytest "$root/tests/python" -q >"$logs/pytest.log" 2>&1
rc=$?
note "pytest: $(tail -1 "$logs/pytest.log") (rc $rc)"
[ $rc -eq 0 ] || failed=1

# ---- compute-sanitizer over the sm90 tests ----
default_filter='FewRows/*:DirectSplit/*:Pairs/*:OneSplit/*:Ragged/*:Sm90DecodeGraph.*'
default_filter+=':Sm90DecodeIndices.*:Sm90DecodeNaN.*:Sm90DecodeSinks.*:Sm90DecodeTables.*'
default_filter+=':Sm90DecodeDsMla.*'
filter=${MLA_SANITIZE_FILTER:-$default_filter}
sparse_filter=${MLA_SANITIZE_SPARSE_FILTER:-'Formats/*:Blocks/*:Sm90SparseNaN.*'}
fp8_filter=${MLA_SANITIZE_FP8_FILTER:-'Fp8Mma/*:Fp8Regs/*:Fp8Seesaw/*:Fp8SeesawDirect/*:Fp8Widened/*'}
for tool in ${MLA_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
  for suite in decode fp8 sparse; do
    log="$logs/sanitize-$tool.log"
    f=$filter
    [ $suite = sparse ] && log="$logs/sanitize-$tool-sparse.log" && f=$sparse_filter
    [ $suite = fp8 ] && log="$logs/sanitize-$tool-fp8.log" && f=$fp8_filter
    extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    timeout "${MLA_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 3 \
      "$root/build/tests/sm90_${suite/fp8/decode}_test" --gtest_filter="$f" >"$log" 2>&1
    rc=$?
    errors=$(grep -E '^========= (ERROR SUMMARY|RACECHECK SUMMARY)' "$log" | tail -1)
    tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')
    note "$tool ($suite): ${errors:-no summary} ${tests}(rc $rc)"
    [ $rc -eq 0 ] || failed=1
  done
done

echo
printf '%s\n' "${summary[@]}"
exit $failed
