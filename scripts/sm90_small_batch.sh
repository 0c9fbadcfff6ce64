#!/usr/bin/env bash
# Small-batch timing study on an sm90 GPU (docs/perf-notes.md, "Small batches"): for the B = 1 goal
# rows, the whole call at several split caps (MLA_SM90_MAX_SPLITS), with and without PDL, then the
# goal suite. Expects a built tree
# (build/mla-bench); logs go to $1 (default: build/small-batch), a table to stdout.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench="$root/build/mla-bench"
logs=${1:-$root/build/small-batch}
iters=${ITERS:-50}
mkdir -p "$logs"

median() { sed -n 's/^time: *median \([0-9.]*\) us.*/\1/p' "$1"; }

rows=("1 8192 128" "1 65536 128" "1 8192 16")
table="| batch | seq_len | heads | split cap | whole call us | whole, --pdl us |\n| --- | --- | --- | --- | --- | --- |\n"
for row in "${rows[@]}"; do
  read -r b s h <<<"$row"
  for cap in 0 64 32; do
    tag="b${b}_s${s}_h${h}_cap${cap}"
    MLA_SM90_MAX_SPLITS=$cap "$bench" --batch "$b" --seq-len "$s" --heads "$h" \
      --iters "$iters" >"$logs/$tag.whole.log" 2>&1
    MLA_SM90_MAX_SPLITS=$cap "$bench" --batch "$b" --seq-len "$s" --heads "$h" \
      --iters "$iters" --pdl >"$logs/$tag.pdl.log" 2>&1
    table+="| $b | $s | $h | ${cap/#0/policy} | $(median "$logs/$tag.whole.log") | \
$(median "$logs/$tag.pdl.log") |\n"
  done
done
"$bench" --suite goals --iters "$iters" >"$logs/goals.log" 2>&1
echo "== goal suite =="
tail -n 12 "$logs/goals.log"
echo "== B = 1: whole call by split cap =="
printf "%b" "$table"
