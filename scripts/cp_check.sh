#!/usr/bin/env bash
# The context-parallel check, for a machine with two Hopper GPUs: builds the library with CUDA into
# build-cp-cuda, runs (a) the GPU tests of the merge and of the peer exchange, and the cpu merge and
# context-parallel tests, (b) the 2-GPU test under torchrun, (c) the benchmark (bench/cp_bench.py),
# once per exchange method; prints one summary line per step, last.
#
#   scripts/cp_check.sh [LOG_DIR]        logs go to LOG_DIR (default: build-cp-cuda/cp-check)
#
# Environment:
#   MLA_PYTHON   interpreter with PyTorch, numpy, ml_dtypes, pytest (default: python3); where it
#                lacks apache-tvm-ffi, the wheel in .whl-gpu/ is installed into it (no network)
#   CP_BENCH_ARGS  extra arguments of bench/cp_bench.py (e.g. --quick)
#   CP_METHODS     the exchange methods the 2-GPU benchmark runs (default: p2p all_gather all_to_all)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build-cp-cuda"
logs=${1:-$build/cp-check}
python=${MLA_PYTHON:-python3}
mkdir -p "$logs"
summary=()
failed=0
note() { summary+=("$1"); echo "cp_check: $1" >&2; }
finish() {
  echo "---- cp_check summary ----"
  printf '%s\n' "${summary[@]}"
  exit $failed
}

# ---- environment: apache-tvm-ffi from the local wheel where missing ----
if ! "$python" -c "import tvm_ffi" >/dev/null 2>&1; then
  wheel=$(ls "$root"/.whl-gpu/apache_tvm_ffi-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    "$python" -m pip install --no-index --no-deps "$wheel" >"$logs/pip.log" 2>&1 ||
      note "pip install $wheel: FAILED (see $logs/pip.log)"
  fi
fi

# ---- build ----
export PATH="$PATH:/usr/local/cuda/bin"
if ! { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMLA_ENABLE_CUDA=ON \
  -DMLA_BUILD_TESTS=ON -DMLA_BUILD_PYTHON=ON -DMLA_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$(command -v "$python")" &&
  cmake --build "$build" -j "$(nproc)" --target mla_decode_ffi sm90_merge_test cpu_merge_test \
    host_merge_validate_test sm90_exchange_test host_exchange_validate_test; } >"$logs/build.log" 2>&1; then
  note "build: FAILED (see $logs/build.log)"
  failed=1
  finish
fi
note "build: ok"
export MLA_DECODE_LIBRARY="$build/libmla_decode_ffi.so"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"

# ---- (a) the merge and the peer exchange on the GPU, and the cpu suites of the merge and
# simulated ranks ----
for t in sm90_merge_test cpu_merge_test host_merge_validate_test sm90_exchange_test \
  host_exchange_validate_test; do
  "$build/tests/$t" >"$logs/$t.log" 2>&1
  rc=$?
  note "$t: $(grep -E '^\[  (PASSED|FAILED)  \]' "$logs/$t.log" | tr '\n' ' ') (rc $rc)"
  [ $rc -eq 0 ] || failed=1
done
"$python" -m pytest "$root/tests/python/test_context_parallel.py" -q >"$logs/pytest_cp.log" 2>&1
rc=$?
note "pytest test_context_parallel: $(tail -1 "$logs/pytest_cp.log") (rc $rc)"
[ $rc -eq 0 ] || failed=1

# ---- (b) two GPUs, one process each ----
"$python" -m torch.distributed.run --nproc_per_node=2 -m pytest \
  "$root/tests/python/test_distributed.py" -q >"$logs/torchrun_test.log" 2>&1
rc=$?
note "torchrun test_distributed: $(grep -E 'passed|failed|skipped' "$logs/torchrun_test.log" | tail -2 | tr '\n' ' ') (rc $rc)"
[ $rc -eq 0 ] || failed=1

# ---- (c) the benchmark: one GPU, then two ----
# shellcheck disable=SC2086
"$python" "$root/bench/cp_bench.py" --json "$logs/cp_bench_1gpu.json" ${CP_BENCH_ARGS:-} \
  >"$logs/cp_bench_1gpu.log" 2>&1
rc1=$?
rc2=0
for method in ${CP_METHODS:-p2p all_gather all_to_all}; do
  # shellcheck disable=SC2086
  "$python" -m torch.distributed.run --nproc_per_node=2 "$root/bench/cp_bench.py" \
    --method "$method" --json "$logs/cp_bench_$method.json" \
    --baseline "$logs/cp_bench_1gpu.json" ${CP_BENCH_ARGS:-} >"$logs/cp_bench_$method.log" 2>&1 ||
    rc2=$?
done
note "cp_bench: rc $rc1 (1 GPU), rc $rc2 (2 GPUs); tables in $logs/cp_bench_<method>.log"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] || failed=1
for method in ${CP_METHODS:-p2p all_gather all_to_all}; do
  [ -f "$logs/cp_bench_$method.log" ] &&
    summary+=("method $method:" "$(grep -A40 '^| B ' "$logs/cp_bench_$method.log" | head -20)")
done
finish
