#!/usr/bin/env bash
# mla-bench's command line: every bad flag or value exits with status 2 and a message naming the
# flag, the value and what is allowed (never a signal or an uncaught exception), and B = 0 runs
# as a no-op. Everything runs on the cpu backend (or is refused before any work), so no GPU is
# needed. Usage: cli_test.sh path/to/mla-bench
set -u
bench=${1:?usage: cli_test.sh path/to/mla-bench}
bench=$(cd "$(dirname "$bench")" && pwd)/$(basename "$bench")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"  # whatever a run writes by mistake lands here
failures=0
runs=0

# expect STATUS TEXT... -- ARGS...: runs mla-bench ARGS; passes when the exit status is STATUS and
# the output (stdout and stderr) contains every TEXT (fixed strings).
expect() {
  local want=$1 got=0 text missing=""
  shift
  local texts=()
  while [ "$1" != "--" ]; do
    texts+=("$1")
    shift
  done
  shift
  runs=$((runs + 1))
  timeout 120 "$bench" "$@" >"$tmp/out" 2>&1 || got=$?
  for text in "${texts[@]}"; do
    grep -qF -- "$text" "$tmp/out" || missing+=" [$text]"
  done
  if grep -q "terminate called" "$tmp/out"; then missing+=" (an uncaught exception)"; fi
  if [ "$got" != "$want" ] || [ -n "$missing" ]; then
    failures=$((failures + 1))
    echo "FAIL: mla-bench$(printf ' %q' "$@"): status $got, expected $want; missing:$missing"
    sed 's/^/  | /' "$tmp/out"
  else
    echo "ok:   mla-bench$(printf ' %q' "$@"): status $got"
  fi
}

int32="an integer from 0 to 2147483647"

# Numbers: the whole string, in range, or the flag is refused.
expect 2 "mla-bench: --page-size: expected a power of two from 1 to 1073741824, got '0'" -- \
  --page-size 0
expect 2 "--page-size: expected a power of two from 1 to 1073741824, got '48'" -- --page-size 48
expect 2 "--heads: expected an integer from 1 to 2147483647, got '-1'" -- --heads -1
expect 2 "--heads: expected an integer from 1 to 2147483647, got '0'" -- --heads 0
expect 2 "--batch: expected $int32, got '99999999999'" -- --batch 99999999999
expect 2 "--batch: expected $int32, got '-5'" -- --batch -5
expect 2 "--batch: expected $int32, got '4x'" -- --batch 4x
expect 2 "--batch: expected $int32, got ' 4'" -- --batch " 4"
expect 2 "--batch: expected $int32, got '+4'" -- --batch +4
expect 2 "--batch: expected $int32, got ''" -- --batch ""
expect 2 "--seq-len: expected $int32, got '-3'" -- --seq-len -3
expect 2 "--q-len: expected $int32, got '1.5'" -- --q-len 1.5
expect 2 "--seq-sd: expected $int32, got '-2'" -- --seq-sd -2
expect 2 "--iters: expected an integer from 1 to 1000000, got '0'" -- --iters 0
expect 2 "--warmup: expected an integer from 0 to 1000000, got '-1'" -- --warmup -1
expect 2 "--seed: expected an integer from 0 to 18446744073709551615, got '18446744073709551616'" \
  -- --seed 18446744073709551616
expect 2 "--batch: needs a value" -- --backend cpu --batch

expect 2 "--sparse-top-k: expected $int32, got '-1'" -- --sparse-top-k -1
expect 2 "--sparse-top-k: expected $int32, got '2k'" -- --sparse-top-k 2k
expect 2 "--topk-len-mean: expected an integer from 1 to 2147483647, got '0'" -- --topk-len-mean 0
expect 2 "--topk-len-mean: needs a value" -- --sparse-top-k 64 --topk-len-mean

# Names, files and the command line itself.
expect 2 "--dtype: expected bf16, fp16, fp8, bf16-fp8 or fp32, got 'fp64'" -- --dtype fp64
expect 2 "--backend: expected auto, sm90 or cpu, got 'gpu'" -- --backend gpu
expect 2 "--suite: expected goals, sweep or sparse, got 'all'" -- --suite all
expect 2 "--list: needs --suite goals, --suite sweep or --suite sparse" -- --list
expect 2 "--kv-format: expected plain or fp8_ds_mla, got 'fp8'" -- --kv-format fp8
expect 2 "--head-dims: expected 512,64, 256,64 or 512,0, got '576'" -- --head-dims 576
expect 2 "unknown option '--bogus'" -- --bogus
expect 2 "unexpected argument 'foo'" -- foo
expect 2 "--json-out: cannot open '$tmp/missing/x.json' for writing" -- \
  --backend cpu --json-out "$tmp/missing/x.json"
expect 2 "--times-out: expected a file name, got '--json'" -- --times-out --json

# Flags that cannot go together, in either order: refused before any work.
expect 2 "--topk-len-mean 512: needs sparse mode (--sparse-top-k K, K > 0)" -- \
  --backend cpu --topk-len-mean 512
expect 2 "--topk-len-mean: expected a mean from 1 to --sparse-top-k 64, got '65'" -- \
  --topk-len-mean 65 --sparse-top-k 64
expect 2 "--kv-format fp8_ds_mla: needs --dtype bf16" "got --dtype fp16" -- \
  --kv-format fp8_ds_mla --dtype fp16
expect 2 "--kv-format fp8_ds_mla: needs --dtype bf16" "got --dtype bf16-fp8" -- \
  --dtype bf16-fp8 --kv-format fp8_ds_mla
expect 2 "--suite sparse: each row sets its own" "drop --dtype" -- --suite sparse --dtype bf16
expect 2 "--suite sparse: each row sets its own" "drop --kv-format" -- \
  --suite sparse --kv-format fp8_ds_mla --list
expect 2 "--suite sparse: each row sets its own" "drop --sparse-top-k" -- \
  --suite sparse --sparse-top-k 2048
expect 2 "--suite sparse: each row sets its own" "drop --head-dims" -- \
  --suite sparse --head-dims 512,0
expect 2 "--kv-format fp8_ds_mla: needs --head-dims 512,64" -- \
  --kv-format fp8_ds_mla --head-dims 256,64
expect 2 "--ds-scales: expected amax or ue8m0, got 'pow2'" -- --kv-format fp8_ds_mla --ds-scales pow2
expect 2 "--ds-scales ue8m0: needs --kv-format fp8_ds_mla" -- --ds-scales ue8m0

# Flags this machine or backend cannot run: refused before any work, still status 2.
expect 2 "--suite goals: the table would run on the cpu backend" "--allow-cpu" -- \
  --suite goals --backend cpu
expect 2 "--suite sweep: the table would run on the cpu backend" "--allow-cpu" -- \
  --suite sweep --backend cpu
expect 2 "--suite sparse: the table would run on the cpu backend" "--allow-cpu" -- \
  --suite sparse --backend cpu
expect 2 "--suite sweep: the table would run on the cpu backend" -- \
  --suite sweep --backend cpu --dtype bf16-fp8 --json-out "$tmp/sweep.json"
runs=$((runs + 1))
if [ -e "$tmp/sweep.json" ]; then
  failures=$((failures + 1))
  echo "FAIL: a refused --suite sweep wrote its --json-out file"
else
  echo "ok:   a refused --suite sweep writes nothing"
fi
expect 2 "of host memory" "lower --batch" -- --backend cpu --batch 2147483647 --seq-len 2147483647
# Without a Hopper GPU (or CUDA) the sm90 backend is refused; with one, the library refuses 200
# heads. Either way: status 2 and a message about sm90.
expect 2 "sm90" -- --backend sm90 --heads 200 --batch 1 --seq-len 64 --iters 1

# Runs: B = 0 is a no-op, reported as such; a small run checks and reports its iterations, with
# progress on stderr.
expect 0 "a no-op call: batch 0" "check:  none" -- --backend cpu --batch 0 --iters 1
expect 0 '"no_op": true' '"requests": 0' -- --backend cpu --batch 0 --iters 2 --json
# The JSON names how the call was timed: --pdl and --layer (plan outside the graph) as given.
expect 0 '"pdl": false, "layer": false' -- --backend cpu --batch 1 --seq-len 16 --heads 2 --iters 1 --json
expect 0 '"pdl": true, "layer": true' -- --backend cpu --batch 1 --seq-len 16 --heads 2 --iters 1 \
  --pdl --layer --json
# The read floor is a GPU measurement: 0 on the cpu backend, and no `read:` line.
expect 0 '"read_floor_us": 0.000' -- --backend cpu --batch 1 --seq-len 16 --heads 2 --iters 1 --json
runs=$((runs + 1))
if "$bench" --backend cpu --batch 1 --seq-len 16 --heads 2 --iters 1 2>/dev/null | grep -q '^read:'; then
  failures=$((failures + 1))
  echo "FAIL: mla-bench printed a read floor on the cpu backend"
else
  echo "ok:   mla-bench prints no read floor on the cpu backend"
fi
expect 0 "bitwise equal" "over 2 iterations" "started" "finished in" -- \
  --backend cpu --batch 3 --seq-len 100 --heads 4 --q-len 2 --page-size 16 --iters 2 --warmup 0
expect 0 "usage: mla-bench" "Exit status" "--sparse-top-k K" "--topk-len-mean N" \
  "--kv-format F" "--suite sparse" -- --help

# Sparse and fp8_ds_mla runs on the cpu backend: each passes its check (the sampled requests re-run
# alone, bitwise equal). Sparse counts only the entries a token counts: with seq_len 4 and q_len 2
# the tokens see 3 and 4 keys, so 3.5 of the 512 entries on average (the rest is -1 padding).
expect 0 "sparse top_k 64" "bitwise equal" "64.0 counted entries per query token" -- \
  --backend cpu --batch 3 --seq-len 300 --heads 4 --q-len 2 --page-size 16 --iters 2 \
  --sparse-top-k 64
expect 0 "cache fp8_ds_mla" "bitwise equal" -- \
  --backend cpu --batch 3 --seq-len 100 --heads 4 --q-len 2 --page-size 16 --iters 1 \
  --kv-format fp8_ds_mla
expect 0 '"kv_format": "fp8_ds_mla"' '"sparse_top_k": 96' '"topk_len_mean": 40' '"passed": true' \
  -- --backend cpu --batch 4 --seq-len 200 --seq-sd 50 --heads 2 --q-len 3 --page-size 8 \
  --iters 1 --kv-format fp8_ds_mla --sparse-top-k 96 --topk-len-mean 40 --json
expect 0 '"mean_counted_entries": 3.500' '"passed": true' -- \
  --backend cpu --batch 2 --seq-len 4 --heads 2 --q-len 2 --page-size 2 --iters 1 \
  --sparse-top-k 512 --json

# --suite sweep --list: a dry run (nothing measured, no GPU needed) that prints the sweep's shapes,
# one table row each: at least 40, within the sweep's ranges (batch 1..1024, seq_len 512..262144,
# heads 8..128, q_len 1..4, pages 32 and 64, a cache of at most 70 GB in bf16), fixed and varlen,
# and holding every shape of the FlashMLA comparison of issue 35.
expect 0 "suite sweep: " "configurations, dtype bf16" -- --suite sweep --list
expect 0 "dtype bf16-fp8" -- --suite sweep --list --dtype bf16-fp8
expect 0 "suite goals: 10 configurations" -- --suite goals --list

# --suite sparse --list: the sparse table's nine rows (issue 33), seq_len 8192 and top_k 2048 each:
# B128 q1 H128, B128 q2 H128 and B128 q1 H64 in fp8_ds_mla; B64 q1 H16 in each cache format; H128
# with the per-tensor fp8 and bf16 caches; B128 q1 H128 fp8_ds_mla with lens of mean 1024.
runs=$((runs + 1))
"$bench" --suite sparse --list >"$tmp/sparse" 2>&1
# Rows: | # | batch | q_len | seq_len | heads | page | query | cache | top_k | topk lens | GiB | it |
got=$(awk -F'|' '/^\| [0-9]/ {
    for (i = 2; i <= 11; i++) gsub(/^ +| +$/, "", $i)
    if ($5 != 8192 || $10 != 2048 || $8 != "bf16") print "bad row: " $0
    print $3 " " $4 " " $6 " " $9 " " $11
  }' "$tmp/sparse" | sort)
want=$(printf '%s\n' "128 1 128 fp8_ds_mla all counted" "128 2 128 fp8_ds_mla all counted" \
  "128 1 64 fp8_ds_mla all counted" "64 1 16 bf16 all counted" \
  "64 1 16 fp8 (per-tensor) all counted" "64 1 16 fp8_ds_mla all counted" \
  "128 1 128 fp8 (per-tensor) all counted" "128 1 128 bf16 all counted" \
  "128 1 128 fp8_ds_mla mean 1024" | sort)
if [ "$got" != "$want" ] || ! grep -q "^suite sparse: 9 configurations" "$tmp/sparse"; then
  failures=$((failures + 1))
  echo "FAIL: mla-bench --suite sparse --list:"
  sed 's/^/  | /' "$tmp/sparse"
  diff <(echo "$want") <(echo "$got") | sed 's/^/  diff: /'
else
  echo "ok:   mla-bench --suite sparse --list: the nine sparse rows"
fi
runs=$((runs + 1))
"$bench" --suite sweep --list >"$tmp/list" 2>&1
# Rows: | # | batch | q_len | seq_len [varlen (sd N)] | heads | page | cache GiB | iterations |
problems=$(awk -F'|' '
  /^\| [0-9]/ {
    n++; b = $3 + 0; q = $4 + 0; split($5, seq, " "); h = $6 + 0; pg = $7 + 0
    varlen = ($5 ~ /varlen/)
    if ($5 ~ /varlen/ && $5 !~ "sd " int(seq[1] / 2) ")") print "row " n ": sd is not half the mean"
    key = b " " q " " seq[1] " " varlen " " h
    have[key] = 1
    if (varlen) nvar++; else nfixed++
    if (b < 1 || b > 1024 || seq[1] < 512 || seq[1] > 262144 || q < 1 || q > 4 ||
        (h != 8 && h != 16 && h != 32 && h != 64 && h != 128) || (pg != 32 && pg != 64))
      print "row " n " out of range:" $0
    if (b * seq[1] * 576 * 2 > 70e9) print "row " n ": cache over 70 GB:" $0
    bs[b] = 1; hs[h] = 1; qs[q] = 1; ps[pg] = 1
    if (seq[1] < minseq || minseq == 0) minseq = seq[1]
    if (seq[1] > maxseq) maxseq = seq[1]
  }
  END {
    if (n < 40) print "only " n " rows"
    if (!nvar || !nfixed) print "fixed and varlen rows expected"
    if (!(1 in bs) || !(1024 in bs)) print "batch 1 and 1024 expected"
    if (minseq != 512 || maxseq != 262144) print "seq_len 512 to 262144 expected"
    if (length(hs) != 5 || length(qs) != 4 || length(ps) != 2) print "heads, q_len or pages missing"
    # The FlashMLA comparison: batch, q_len, seq_len, varlen, heads.
    split("128 1 8192 0 128,128 2 8192 0 128,128 4 8192 0 128,64 2 8192 1 128,8 1 32768 0 128," \
          "128 1 8192 0 64,128 1 8192 0 16,128 1 8192 0 32,1 1 8192 0 128,1 1 65536 0 128," \
          "1 1 8192 0 16,32 1 4096 0 128,16 1 16384 1 16,256 1 2048 0 128,64 2 8192 1 16," \
          "2 1 131072 0 128", want, ",")
    for (i in want) if (!(want[i] in have)) print "missing shape " want[i]
  }' "$tmp/list")
rows=$(grep -c '^| [0-9]' "$tmp/list")
if [ -n "$problems" ] || ! grep -q "^suite sweep: $rows configurations" "$tmp/list"; then
  failures=$((failures + 1))
  echo "FAIL: mla-bench --suite sweep --list ($rows rows):"
  echo "$problems" | sed 's/^/  | /'
else
  echo "ok:   mla-bench --suite sweep --list: $rows shapes, within the sweep's ranges"
fi

# --json: stdout holds only JSON lines (progress goes to stderr).
runs=$((runs + 1))
if "$bench" --backend cpu --batch 1 --seq-len 16 --heads 2 --iters 1 --json 2>/dev/null |
  grep -qv '^{'; then
  failures=$((failures + 1))
  echo "FAIL: mla-bench --json printed something other than JSON lines on stdout"
else
  echo "ok:   mla-bench --json: stdout holds only JSON lines"
fi

echo "$((runs - failures)) of $runs passed"
[ "$failures" = 0 ]
