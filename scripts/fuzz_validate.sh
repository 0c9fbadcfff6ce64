#!/usr/bin/env bash
# Fuzzes the host validation of the C++ API (tests/fuzz/validate_fuzz.cc) with libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, against a cpu-only build of the library in
# build-fuzz/. Not part of CI: run it by hand, for ten minutes or more.
#
#   scripts/fuzz_validate.sh [SECONDS] [libFuzzer flags...]   (default: 600 seconds)
#
# Needs clang and libFuzzer (Debian: apt-get install clang-14 libclang-rt-14-dev; CXX picks another
# clang++). The corpus grows in build-fuzz/corpus/ across runs; a finding is written to
# build-fuzz/crash-* (or leak-*, timeout-*), and `build-fuzz/validate_fuzz FILE` replays it. The
# last lines give the run's execution count (stat::number_of_executed_units).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
seconds=${1:-600}
[ $# -gt 0 ] && shift
cxx=${CXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [ -z "$cxx" ]; then
  echo "fuzz_validate.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi
cc=${CC:-${cxx/clang++/clang}}
sanitizers=address,undefined
build=build-fuzz
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_CXX_COMPILER="$cxx" -DMLA_ENABLE_CUDA=OFF -DMLA_BUILD_TESTS=OFF -DMLA_BUILD_BENCH=OFF \
  -DMLA_BUILD_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,$sanitizers -fno-sanitize-recover=undefined" \
  >/dev/null
cmake --build "$build" --target mla_decode -j "$(nproc)"
"$cxx" -std=c++17 -g -O1 -fsanitize=fuzzer,$sanitizers -fno-sanitize-recover=undefined \
  -I include -I src tests/fuzz/validate_fuzz.cc "$build/libmla_decode.a" -pthread \
  -o "$build/validate_fuzz"
mkdir -p "$build/corpus"
cd "$build"
# One worker; -timeout: a call that takes seconds is a finding too.
exec ./validate_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 "$@" corpus
