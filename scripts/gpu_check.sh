#!/usr/bin/env bash
# The GPU check, for a machine with a Hopper GPU: builds with CUDA, runs the whole suite (CTest,
# then pytest with the PyTorch GPU tests), then compute-sanitizer's memcheck, racecheck, synccheck
# and initcheck over the sm90 tests, and prints one summary line per step and tool.
#
#   scripts/gpu_check.sh [LOG_DIR]        logs go to LOG_DIR (default: build/gpu-check)
#
# The sanitizers run over groups of tests (below), each (tool, group) pair a process of its own,
# MLA_SANITIZE_JOBS of them at a time on each GPU, so that the step takes about as long as its
# slowest process rather than their sum (racecheck over all the decode groups in one process ran
# past 430 s on an H100). On a host of several GPUs the work spreads over them: pytest runs on the
# second GPU beside CTest on the first, and the sanitizer processes go to the GPUs in turn.
#
# Environment:
#   MLA_PYTHON              interpreter with PyTorch, apache-tvm-ffi, numpy, ml_dtypes and pytest
#                           (default: python3); the module is built against its apache-tvm-ffi
#   MLA_GPU_CHECK_STEPS     the steps to run (default: build suite sanitize; without build, the
#                           existing build is used)
#   MLA_SANITIZE_SCOPE      groups (default): the named groups below; all: every sm90 test binary,
#                           its whole test list cut into MLA_SANITIZE_SHARDS gtest shards (default 8
#                           for the decode tests, a quarter of that for the sparse tests, one
#                           process for the others), and the forced-pairs group; LOG.time holds
#                           each process's seconds
#   MLA_SANITIZE_EXCLUDE    with scope all, a gtest negative filter applied to every binary (for
#                           example 'Extremes/*' for the tools that take too long on them)
#   MLA_SANITIZE_FILTER     gtest filter of the sm90 decode tests the sanitizers run, as one group
#                           (default: the groups fewrows, calls, splits, pairs and schedule below:
#                           every kernel and route at small sizes; '*' runs all, which takes long)
#   MLA_SANITIZE_SPARSE_FILTER  the same for tests/sm90/sparse_test.cc (default: every format on
#                           both kernels, the block and split cases, tokens started longest first,
#                           the per-tensor e4m3 rows landed as e4m3, NaN propagation)
#   MLA_SANITIZE_FP8_FILTER the same for the decode tests over e4m3 caches (default: the few-rows
#                           kernel's routes, the FP8 seesaw kernel on both layouts, the widened
#                           ring, the bf16-query routes)
#   MLA_SANITIZE_TOOLS      the tools to run (default: memcheck racecheck synccheck initcheck)
#   MLA_SANITIZE_TIMEOUT    seconds each (tool, group) process may take (default 420)
#   MLA_SANITIZE_JOBS       processes at a time on each GPU (default 8)
#   MLA_GPU_CHECK_GPUS      the GPUs to use, as CUDA_VISIBLE_DEVICES names them (default: those
#                           CUDA_VISIBLE_DEVICES lists, else every GPU nvidia-smi lists)
# racecheck: LOG_DIR/sanitize-racecheck-GROUP.log holds the first 2000 hazards and the total, and
# LOG_DIR/sanitize-racecheck-GROUP.classes counts the displayed ones by their two source lines and by
# test, and names the tests run after the last displayed one when the limit hid some; the
# step's line names the groups that are not clean.
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

steps=" ${MLA_GPU_CHECK_STEPS:-build suite sanitize} "

# The GPUs to spread the suite and the sanitizer processes over (one entry: all on that GPU).
gpu_list=${MLA_GPU_CHECK_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
if [ -z "$gpu_list" ]; then
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  gpu_list=$(seq -s, 0 $((${n:-1} > 0 ? ${n:-1} - 1 : 0)))
fi
IFS=',' read -r -a gpus <<<"$gpu_list"
[ ${#gpus[@]} -gt 0 ] || gpus=(0)

# ---- build ----
export PATH="$PATH:/usr/local/cuda/bin"
if [[ $steps != *" build "* ]]; then
  note "build: skipped (MLA_GPU_CHECK_STEPS)"
elif ! { cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DMLA_ENABLE_CUDA=ON \
  -DMLA_BUILD_TESTS=ON -DMLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$python")" &&
  cmake --build "$root/build" -j "$(nproc)"; } >"$logs/build.log" 2>&1; then
  note "build: FAILED (see $logs/build.log)"
  printf '%s\n' "${summary[@]}"
  exit 1
else
  note "build: ok"
fi

# ---- the suite ----
if [[ $steps == *" suite "* ]]; then
  # pytest on the second GPU where there is one, beside CTest on the first; else after it.
  run_pytest() {
    CUDA_VISIBLE_DEVICES=$1 MLA_DECODE_LIBRARY="$root/build/libmla_decode_ffi.so" \
      PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
      "$python" -m pytest "$root/tests/python" -q >"$logs/pytest.log" 2>&1
    echo $? >"$logs/pytest.rc"
  }
  pytest_pid=
  if [ ${#gpus[@]} -gt 1 ]; then
    run_pytest "${gpus[1]}" &
    pytest_pid=$!
  fi
  (cd "$root/build" && CUDA_VISIBLE_DEVICES=${gpus[0]} ctest --output-on-failure -j 4) \
    >"$logs/ctest.log" 2>&1
  rc=$?
  note "ctest: $(grep -E 'tests passed|tests failed' "$logs/ctest.log" | tail -1) (rc $rc)"
  [ $rc -eq 0 ] || failed=1
  if [ -n "$pytest_pid" ]; then wait "$pytest_pid"; else run_pytest "${gpus[0]}"; fi
  rc=$(cat "$logs/pytest.rc" 2>/dev/null || echo missing)
  note "pytest: $(tail -1 "$logs/pytest.log") (rc $rc)"
  [ "$rc" = 0 ] || failed=1
fi

# ---- compute-sanitizer over the sm90 tests ----
groups=()  # name|test binary|gtest filter|environment (NAME=VALUE, or empty)|shard (INDEX/TOTAL, or empty)
if [ "${MLA_SANITIZE_SCOPE:-groups}" = all ]; then
  shards=${MLA_SANITIZE_SHARDS:-8}
  exclude=${MLA_SANITIZE_EXCLUDE:+-$MLA_SANITIZE_EXCLUDE}
  # (sm90_route_test is host code alone: the sanitizers refuse a program that makes no CUDA call.)
  for bin in sm90_decode_test sm90_sparse_test sm90_merge_test sm90_widen_test sm90_exchange_test; do
    case $bin in
      sm90_decode_test) n=$shards ;;
      sm90_sparse_test) n=$(((shards + 3) / 4)) ;;
      *) n=1 ;;
    esac
    for ((i = 0; i < n; i++)); do
      short=${bin#sm90_}
      groups+=("${short%_test}-$i|$bin|*$exclude||$i/$n")
    done
  done
elif [ -n "${MLA_SANITIZE_FILTER:-}" ]; then
  groups+=("decode|sm90_decode_test|$MLA_SANITIZE_FILTER||")
else
  groups+=("fewrows|sm90_decode_test|FewRows/*:Ragged/*||")
  groups+=("calls|sm90_decode_test|Sm90DecodeGraph.*:Sm90DecodeIndices.*:Sm90DecodeNaN.*:Sm90DecodeSinks.*:Sm90DecodeTables.*:Sm90DecodeDsMla.*||")
  groups+=("splits|sm90_decode_test|OneSplit/*:DirectSplit/*||")
  groups+=("pairs|sm90_decode_test|Pairs/*||")
  # CTAs that walk several segments (the balanced schedule), plans run twice, the other head dims.
  groups+=("schedule|sm90_decode_test|Schedule/*:Sm90DecodePlanReuse.*:Sm90DecodeHeadDims.*||")
fi
# The combine's row kernel on every call with a combine, rows of many splits included (CTest's
# CombineRows).
groups+=("combinerows|sm90_decode_test|Schedule/*:DirectSplit/*:Sm90DecodeSinks.*:Sm90DecodeNaN.*|MLA_SM90_COMBINE_ROWS=256|")
# The cluster-pair kernels at every shape the pair route would refuse (CTest's PairsForced).
groups+=("pairsforced|sm90_decode_test|Pairs/*:Sm90DecodePairs.*|MLA_SM90_PAIR=1|")
if [ "${MLA_SANITIZE_SCOPE:-groups}" != all ]; then
  groups+=("fp8|sm90_decode_test|${MLA_SANITIZE_FP8_FILTER:-Fp8Mma/*:Fp8Regs/*:Fp8Seesaw/*:Fp8SeesawDirect/*:Fp8Widened/*:Sm90DecodeFp8Direct.*}||")
  # The FP8 seesaw kernel's two-consumer form (the default is three consumers) over the FP8
  # seesaw cases (CTest's Fp8Two).
  groups+=("fp8two|sm90_decode_test|Fp8Seesaw/*:Sm90DecodeFp8Graph.*|MLA_SM90_FP8_THREE=0|")
  groups+=("sparse|sm90_sparse_test|${MLA_SANITIZE_SPARSE_FILTER:-Formats/*:Blocks/*:Ordered/*:Fp8Direct/*:Sm90SparseNaN.*}||")
  # The sparse calls' combines on the row kernel, its one-pass form where a token has at most
  # three splits (CTest's sm90_sparse_test.CombineRows1).
  groups+=("sparsecombine|sm90_sparse_test|Formats/*:Lens/*:Sm90SparseNaN.*|MLA_SM90_COMBINE_ROWS=256|")
  # A token's two splits merged in their cluster wherever a tile has 16 rows (CTest's
  # sm90_sparse_test.PairMerge).
  groups+=("sparsemerge|sm90_sparse_test|Formats/*:Lens/*:Sm90SparseNaN.*|MLA_SM90_MAX_SPLITS=2|")
  # The seesaw kernel's CTAs walking several tokens (CTest's RowsForced: three token rows).
  groups+=("sparserows|sm90_sparse_test|Formats/*:Lens/*:Ordered/*|MLA_SM90_SPARSE_ROWS=3|")
  # Every token's tiles unpaired (CTest's Unpaired): 128 heads over e4m3 rows on the unpaired
  # gathers.
  groups+=("sparseunpaired|sm90_sparse_test|Formats/*:Ordered/*|MLA_SM90_PAIR=0|")
fi
tools=${MLA_SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
# One (tool, group) process; its rc goes to LOG.rc.
sanitize_one() {
  local tool=$1 name=$2 bin=$3 filter=$4 env=$5 shard=$6 gpu=$7
  local log="$logs/sanitize-$tool-$name.log" extra=() vars=("CUDA_VISIBLE_DEVICES=$gpu")
  [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
  [ -n "$env" ] && vars+=("$env")
  [ -n "$shard" ] && vars+=("GTEST_SHARD_INDEX=${shard%/*}" "GTEST_TOTAL_SHARDS=${shard#*/}")
  # The exchange tests' ranks are kernels that wait for each other; under initcheck the ranks of
  # Shapes/PeerExchange never finish (an H100 timed out after 500 s), so that tool runs the
  # one-rank test alone.
  [ "$tool" = initcheck ] && [ "$bin" = sm90_exchange_test ] && filter='PeerExchangeOne.*'
  local t0=$SECONDS
  env "${vars[@]}" timeout "${MLA_SANITIZE_TIMEOUT:-420}" compute-sanitizer --tool "$tool" "${extra[@]}" \
    --print-limit 2000 --error-exitcode 3 "$root/build/tests/$bin" --gtest_filter="$filter" \
    >"$log" 2>&1
  echo $? >"$log.rc"
  echo "$((SECONDS - t0)) s" >"$log.time"
}
if [[ $steps == *" sanitize "* ]]; then
  running=0 next=0
  for tool in $tools; do
    for g in "${groups[@]}"; do
      IFS='|' read -r name bin filter env shard <<<"$g"
      if [ "$running" -ge $((${MLA_SANITIZE_JOBS:-8} * ${#gpus[@]})) ]; then
        wait -n
        running=$((running - 1))
      fi
      sanitize_one "$tool" "$name" "$bin" "$filter" "$env" "$shard" "${gpus[next % ${#gpus[@]}]}" &
      running=$((running + 1)) next=$((next + 1))
    done
  done
  wait
  for tool in $tools; do
    total=0 passed=0 bad=() ok=1
    for g in "${groups[@]}"; do
      IFS='|' read -r name _ _ _ _ <<<"$g"
      log="$logs/sanitize-$tool-$name.log"
      rc=$(cat "$log.rc" 2>/dev/null || echo missing)
      # "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: K hazards displayed (N errors,
      # M warnings)", counted as N + M (warning-level hazards count too)
      n=$(grep -E '^========= (ERROR|RACECHECK) SUMMARY' "$log" | tail -1 |
        sed -E 's/.*\(([0-9]+) errors?, ([0-9]+) warnings?\).*/\1 \2/; s/.*SUMMARY: ([0-9]+) error.*/\1/')
      [[ $n =~ ^([0-9]+)\ ([0-9]+)$ ]] && n=$((BASH_REMATCH[1] + BASH_REMATCH[2]))
      p=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | tail -1 | sed -E 's/^\[  PASSED  \] ([0-9]+).*/\1/')
      failed_tests=$(grep -cE '^\[  FAILED  \] [^0-9]' "$log")
      # A group that ran no test (a filter that matches none, no Hopper GPU) checked nothing.
      if [ "$rc" != 0 ] || ! [[ $n =~ ^[0-9]+$ ]] || [ "$failed_tests" != 0 ] || [ "${p:-0}" = 0 ]; then
        ok=0
        bad+=("$name (rc $rc, ${n:-no summary} errors, ${p:-no} tests passed, $failed_tests failed)")
      fi
      if [ "$tool" = racecheck ] && [ "${n:-0}" != 0 ]; then
        # Hazard classes among the displayed ones (count, kind, first access -> second access),
        # then the tests they came from (gtest's RUN lines between them), then, where racecheck
        # stopped displaying (--print-limit) before the total, the tests that ran after the last
        # displayed hazard: their hazards count in the total but are not classified.
        awk -v total="$n" '
             /^\[ RUN      \] / { test = $4; started[++runs] = test; next }
             /Potential [A-Z]+ hazard/ { match($0, /Potential [A-Z]+/); t = substr($0, RSTART + 10, RLENGTH - 10); k = 0
               shown++; per_test[test]++; last_run = runs; next }
             /(Write|Read) Thread/ && t != "" { match($0, /(Write|Read) Thread/); a = substr($0, RSTART, RLENGTH - 7)
               match($0, / in [^ ]+$/); s[k++] = a "@" substr($0, RSTART + 4)
               if (k == 2) { c[t " " s[0] " -> " s[1]]++; t = "" } }
             END { for (x in c) print c[x], x | "sort -rn"; close("sort -rn")
               print "# displayed hazards by test:"; for (x in per_test) print per_test[x], x | "sort -rn"; close("sort -rn")
               if (total + 0 > shown) {
                 print "# " total - shown " hazards not displayed; tests run after the last displayed one (" runs - last_run "):"
                 for (i = last_run + 1; i <= runs; ++i) print started[i] } }' "$log" >"$logs/sanitize-$tool-$name.classes"
      fi
      [[ $n =~ ^[0-9]+$ ]] && total=$((total + n))
      [ -n "$p" ] && passed=$((passed + p))
    done
    line="$tool: $total errors/hazards over ${#groups[@]} groups, $passed tests passed"
    [ ${#bad[@]} -gt 0 ] && line+="; not clean: ${bad[*]}"
    note "$line (logs: $logs/sanitize-$tool-*.log)"
    [ $ok -eq 1 ] || failed=1
  done
fi

echo
printf '%s\n' "${summary[@]}"
exit $failed
