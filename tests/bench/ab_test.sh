#!/usr/bin/env bash
# scripts/ab.sh over one prebuilt mla-bench (BIN_A, BIN_B: no builds), on the cpu backend: the
# alternation (A B then B A), one line per row with every process's median and B / A, a row that
# cannot run marked and failing the exit status, and bad usage refused with status 2. No GPU is
# needed. Usage: ab_test.sh path/to/mla-bench
set -u
bench=${1:?usage: ab_test.sh path/to/mla-bench}
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")
ab="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/ab.sh"
# The script's other settings from the caller's environment would change what is checked (OUT:
# the calls without their own would write their tables into the caller's folder).
unset OUT ROUNDS A_ENV B_ENV CMAKE_ARGS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAILED: $*"
  failures=$((failures + 1))
}
# Each side through a wrapper that logs its letter, so that the order of the processes shows.
for side in A B; do
  printf '#!/usr/bin/env bash\necho %s >>"%s/order"\nexec "%s" "$@"\n' "$side" "$tmp" "$bench" \
    >"$tmp/bench_$side"
  chmod +x "$tmp/bench_$side"
done
export BIN_A="$tmp/bench_A" BIN_B="$tmp/bench_B" ITERS=2 BENCH_ARGS="--backend cpu"

# Two rows, two rounds: four processes a row, in the order A B B A (OUT keeps each one's output).
printf '# a comment\n--batch 1 --seq-len 64 --heads 16\n\n--batch 2 --seq-len 64 --heads 8  # two\n' \
  >"$tmp/rows"
status=0
OUT="$tmp/out" A_ENV="MLA_AB_SIDE=a" timeout 300 bash "$ab" X Y "$tmp/rows" >"$tmp/table" 2>&1 ||
  status=$?
cat "$tmp/table"
[ "$status" = 0 ] || fail "two good rows: exit status $status, expected 0"
[ "$(grep -c ' | B/A ' "$tmp/table")" = 2 ] || fail "two good rows: expected two B/A lines"
grep -q '^--batch 2 --seq-len 64 --heads 8 | A [0-9.]* [0-9.]* | B [0-9.]* [0-9.]* | B/A [0-9.]* (' \
  "$tmp/table" || fail "the second row's line (comment stripped, two medians a side)"
grep -q '^geometric mean of B/A over 2 rows: ' "$tmp/table" || fail "the geometric mean line"
for f in row1-round1-A row1-round1-B row1-round2-A row1-round2-B row2-round2-B; do
  grep -q '"median_us"' "$tmp/out/$f.txt" 2>/dev/null || fail "no JSON in $f"
done
[ -f "$tmp/out/ab.txt" ] || fail "OUT/ab.txt missing"
# The order: A B in odd rounds, B A in even ones.
[ "$(tr -d '\n' <"$tmp/order")" = ABBAABBA ] || fail "process order $(tr -d '\n' <"$tmp/order")"

# A row mla-bench refuses: marked, and the exit status 1.
status=0
printf -- '--batch 1 --seq-len 64 --heads 16\n--batch 1 --seq-len 64 --heads 0\n' |
  ROUNDS=1 timeout 300 bash "$ab" X Y - >"$tmp/table2" 2>&1 || status=$?
cat "$tmp/table2"
[ "$status" = 1 ] || fail "a refused row: exit status $status, expected 1"
grep -q -- '--heads 0 | A - | B - | did not run' "$tmp/table2" || fail "the refused row's line"

# Bad usage: status 2.
status=0
bash "$ab" X Y >/dev/null 2>&1 || status=$?
[ "$status" = 2 ] || fail "two arguments: exit status $status, expected 2"
status=0
ROUNDS=0 bash "$ab" X Y "$tmp/rows" >/dev/null 2>&1 || status=$?
[ "$status" = 2 ] || fail "ROUNDS=0: exit status $status, expected 2"

if [ "$failures" = 0 ]; then echo "ab_test: all checks passed"; else echo "ab_test: $failures failed"; fi
[ "$failures" = 0 ]
