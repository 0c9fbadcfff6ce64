#!/usr/bin/env bash
# Two builds of mla-bench timed against each other in alternating processes on one GPU, the
# comparison docs/perf-notes.md asks for (a long run's clock steps down under the power cap, and
# hosts differ: only processes that alternate on one GPU compare).
#
#   scripts/ab.sh REF_A REF_B ROWS_FILE
#
# REF_A, REF_B: git revisions (a commit, a branch, HEAD~2), `.` for the working tree as it is, or
#   a folder holding a source tree (`git archive REV | tar -x -C DIR`, for a machine whose copy
#   of the repository lacks the revision); the same REF twice compares two environments (A_ENV,
#   B_ENV) on one binary.
# ROWS_FILE: one row per line, mla-bench's arguments for it (for example
#   `--batch 32 --seq-len 4096 --heads 128`); blank lines and lines from `#` are skipped; `-` reads
#   standard input.
# Each revision is checked out into build-ab/src-SHA (a detached git worktree; `.` builds the
# working tree itself) and its mla-bench built into build-ab/bin-SHA once, then reused (remove
# build-ab/ and run `git worktree prune` to clean up). Each row runs ROUNDS rounds of two
# processes, A B in odd rounds and B A in even ones, each with BENCH_ARGS, the row's arguments and
# `--iters ITERS --json`. One line per row: every process's median (us, `!` after one whose own
# output check failed), B / A of the two sides' mean medians and the per-round B / A; the geometric
# mean of B / A over the rows comes last.
#
# Environment:
#   ROUNDS      rounds per row (default 2: A B B A)
#   ITERS       replays per process (default 30)
#   A_ENV, B_ENV  variables for that side's processes (`MLA_SM90_PAIR=1 MLA_SM90_DIRECT=0`)
#   BENCH_ARGS  arguments added to every process (default `--layer --pdl`)
#   CMAKE_ARGS  extra CMake arguments for both builds (`-DMLA_ENABLE_CUDA=OFF` builds cpu-only)
#   BIN_A, BIN_B  an mla-bench already built for that side: no build, the REF only names it
#   OUT         a folder for every process's output and the table (default: none kept)
# Exit status: 0 when every process ran and passed its check, 1 otherwise, 2 on bad usage.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -eq 3 ] || usage
ref_a=$1 ref_b=$2 rows_file=$3
rounds=${ROUNDS:-2} iters=${ITERS:-30}
bench_args=${BENCH_ARGS---layer --pdl}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: ROUNDS must be a positive integer" >&2; exit 2; }
[[ "$iters" =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: ITERS must be a positive integer" >&2; exit 2; }
if [ "$rows_file" = - ]; then rows=$(cat); else rows=$(cat "$rows_file") || exit 2; fi
rows=$(printf '%s\n' "$rows" | sed -e 's/#.*//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' |
  grep -v '^$' || true)
[ -n "$rows" ] || { echo "ab.sh: no rows in $rows_file" >&2; exit 2; }
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
dir="$root/build-ab"
mkdir -p "$dir"
[ -f "$dir/.gitignore" ] || echo '*' >"$dir/.gitignore"
log=${OUT:-}
[ -z "$log" ] || mkdir -p "$log"

# Builds REF's mla-bench once; prints its path.
build() {
  local ref=$1 src tag
  if [ "$ref" = . ]; then
    src=$root tag=worktree
  elif [ -f "$ref/CMakeLists.txt" ]; then
    src=$(cd "$ref" && pwd)
    tag=tree-$(printf '%s' "$src" | cksum | cut -d' ' -f1)
  else
    local sha
    sha=$(git -C "$root" rev-parse --verify --quiet "$ref^{commit}") ||
      { echo "ab.sh: not a revision: $ref" >&2; return 1; }
    tag=${sha:0:12} src="$dir/src-$tag"
    if [ ! -d "$src" ]; then
      git -C "$root" worktree add --detach "$src" "$sha" >&2 || return 1
    fi
  fi
  echo "ab.sh: building $ref" >&2
  local bin="$dir/bin-$tag" extra=()
  # A worktree or an exported tree has no .deps/: the checkout's own CUTLASS headers serve it.
  [ -d "$src/.deps/cutlass/include" ] || [ ! -d "$root/.deps/cutlass/include" ] ||
    extra+=("-DMLA_CUTLASS_DIR=$root/.deps/cutlass")
  # shellcheck disable=SC2086
  cmake -S "$src" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DMLA_BUILD_BENCH=ON -DMLA_BUILD_TESTS=OFF \
    -DMLA_BUILD_PYTHON=OFF "${extra[@]}" ${CMAKE_ARGS:-} >"$bin.log" 2>&1 &&
    cmake --build "$bin" -j "$(nproc)" --target mla-bench >>"$bin.log" 2>&1 ||
    { echo "ab.sh: the build of $ref failed (see $bin.log)" >&2; return 1; }
  echo "$bin/mla-bench"
}
if [ -n "${BIN_A:-}" ]; then bin_a=$BIN_A; else bin_a=$(build "$ref_a") || exit 1; fi
if [ -n "${BIN_B:-}" ]; then bin_b=$BIN_B; else bin_b=$(build "$ref_b") || exit 1; fi

# The table's arithmetic, in one helper: `median` reads a process's output on stdin and prints
# its median (us) with `!` if its check failed, or `-`; `row ROW "A..." "B..."` prints a row's
# line; `geomean FILE` the geometric mean of the B / A column.
helper=$(mktemp)
table=$(mktemp)
trap 'rm -f "$helper" "$table"' EXIT
cat >"$helper" <<'PY'
import json, math, re, sys

def median():
    med = None
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "median_us" in d:
            passed = d.get("check", {}).get("passed", False)
            med = "%.1f%s" % (d["median_us"], "" if passed else "!")
    print(med if med is not None else "-")

def row(label, a, b):
    a, b = a.split(), b.split()
    if any(x == "-" for x in a + b):
        print("%s | A %s | B %s | did not run" % (label, " ".join(a), " ".join(b)))
        return
    ok = not any(x.endswith("!") for x in a + b)
    num = lambda x: float(x.rstrip("!"))
    ma, mb = sum(map(num, a)) / len(a), sum(map(num, b)) / len(b)
    per = " ".join("%.3f" % (num(y) / num(x)) for x, y in zip(a, b))
    print("%s | A %s | B %s | B/A %.3f (%s)%s" % (label, " ".join(a), " ".join(b), mb / ma, per,
                                                  "" if ok else "  CHECK FAILED"))

def geomean(path):
    r = []
    for line in open(path):
        m = re.search(r"B/A ([0-9.]+) ", line)
        if m:
            r.append(float(m.group(1)))
    if r:
        g = math.exp(sum(map(math.log, r)) / len(r))
        print("geometric mean of B/A over %d rows: %.3f" % (len(r), g))

what = sys.argv[1]
if what == "median":
    median()
elif what == "row":
    row(*sys.argv[2:5])
else:
    geomean(sys.argv[2])
PY

# One process: its median, as the helper prints it.
run_one() {
  local side=$1 row=$2 tag=$3 bin env out
  if [ "$side" = A ]; then bin=$bin_a env=${A_ENV:-}; else bin=$bin_b env=${B_ENV:-}; fi
  # shellcheck disable=SC2086
  out=$(env $env "$bin" $bench_args $row --iters "$iters" --json 2>&1)
  [ -z "$log" ] || printf '%s\n' "$out" >"$log/$tag-$side.txt"
  printf '%s\n' "$out" | python3 "$helper" median
}

status=0
printf 'A: %s (%s)  B: %s (%s)  %s rounds, --iters %s, %s\n' "$ref_a" "${A_ENV:-no env}" "$ref_b" \
  "${B_ENV:-no env}" "$rounds" "$iters" "$bench_args" | tee -a "$table"
n=0
while IFS= read -r row; do
  n=$((n + 1))
  a=() b=()
  for ((r = 1; r <= rounds; ++r)); do
    if ((r % 2)); then order="A B"; else order="B A"; fi
    for side in $order; do
      m=$(run_one "$side" "$row" "row$n-round$r")
      if [ "$side" = A ]; then a+=("$m"); else b+=("$m"); fi
    done
  done
  line=$(python3 "$helper" row "$row" "${a[*]}" "${b[*]}")
  case "$line" in *"CHECK FAILED"* | *"did not run"*) status=1 ;; esac
  printf '%s\n' "$line" | tee -a "$table"
done <<<"$rows"
python3 "$helper" geomean "$table" | tee -a "$table"
[ -z "$log" ] || cp "$table" "$log/ab.txt"
exit $status
