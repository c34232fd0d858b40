#!/bin/sh
# bench/compare-builds.sh: two builds of shardbench against each other, for a
# change that must not move the numbers (a redesign): f64 bitwise, f32 within
# the verdict's tolerances.
#
#   bench/compare-builds.sh OLD_BUILD NEW_BUILD [--world N] [--dtypes f64] [--skip-sweep]
#                           [--old-db FILE] [--keep DIR]
#
# OLD_BUILD and NEW_BUILD are build trees (each with bench/shardbench and
# plans/). Checks:
#   1. the golden runs (verify/golden/debugmodel.json's list, with each run's recipe
#      and AC settings as flags: world 1, every step's loss, gradients and norm, the
#      final weights) written by both builds with
#      --save-trace / --save-weights are byte-identical files;
#   2. a sweep at --world N (default 8) over --dtypes (default f64) with each
#      build: every config has the same status and reason, bitwise the same
#      max_abs_err and max_rel_err (quote() of the REAL: 17 significant digits)
#      and the same comm rows (op, dim, phase, calls, payload and wire bytes).
# Prints what differs and ends "compare-builds: N differences"; exit 0 when none.
# The sweeps take a few minutes each on 2 cores; --skip-sweep does only 1;
# --old-db FILE takes the old build's sweep from FILE (a DB of the same sweep);
# --keep DIR keeps both DBs and the listings there. A reason's plan path is
# compared without its directory (a sweep names plans by the --plans-dir it got).
set -u
[ $# -ge 2 ] || { echo "usage: $0 OLD_BUILD NEW_BUILD [--world N] [--dtypes LIST] [--skip-sweep]" >&2; exit 2; }
OLD=$(cd "$1" && pwd) || exit 2
NEW=$(cd "$2" && pwd) || exit 2
shift 2
world=8 dtypes=f64 sweep=1 olddb='' keep=
while [ $# -gt 0 ]; do
  case $1 in
    --world) world=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --skip-sweep) sweep=0; shift ;;
    --old-db) olddb=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "compare-builds: unknown flag $1" >&2; exit 2 ;;
  esac
done
for b in "$OLD" "$NEW"; do
  [ -x "$b/bench/shardbench" ] || { echo "compare-builds: no $b/bench/shardbench" >&2; exit 2; }
done
SRC=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d /tmp/sb-compare.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
diffs=0
differ() { echo "DIFF: $*"; diffs=$((diffs + 1)); }

# 1. golden runs, world 1
GOLDEN="$SRC/verify/golden/debugmodel.json"
python3 - "$GOLDEN" >"$tmp/runs" <<'EOF'
import json, sys
g = json.load(open(sys.argv[1]))
for i, r in enumerate(g["runs"]):  # the flags as verify/golden_check.c's run_flags gives them
    f = []
    if "ac" in r:
        f += ["--ac", r["ac"]]
    if "max_norm" in r:
        f += ["--max-norm", repr(r["max_norm"])]
    if "global_batch" in r:
        f += ["--global-batch", str(r["global_batch"])]
    if "lr" in r:
        lr = r["lr"]
        f += ["--lr-warmup-steps", str(lr["warmup_steps"]), "--lr-decay-ratio",
              "none" if lr["decay_ratio"] is None else repr(lr["decay_ratio"]),
              "--lr-decay-type", lr["decay_type"], "--lr-min-factor", repr(lr["min_lr_factor"])]
    print(i, r["model"], r["dtype"], r["batch"], r["seq"], r["steps"], *f)
EOF
[ -s "$tmp/runs" ] || { echo "compare-builds: no golden runs in $GOLDEN" >&2; exit 2; }
while read -r i model dtype batch seq steps flags; do
  for side in old new; do
    b=$OLD; [ $side = new ] && b=$NEW
    # shellcheck disable=SC2086 # the flags' words
    "$b/bench/shardbench" run --world 1 --plans-dir "$SRC/plans" --model "$model" --dtype "$dtype" \
      --batch "$batch" --seq "$seq" --warmup 0 --steps "$steps" --save-trace "$tmp/$side-t$i.st" \
      --save-weights "$tmp/$side-w$i.st" $flags >"$tmp/$side-run$i.out" 2>&1 ||
      differ "golden run $i ($model $dtype) failed on $side: $(tail -1 "$tmp/$side-run$i.out")"
  done
  for f in t w; do
    cmp -s "$tmp/old-$f$i.st" "$tmp/new-$f$i.st" ||
      differ "golden run $i ($model $dtype): the $( [ $f = t ] && echo trace || echo weights) files differ"
  done
  echo "golden run $i ($model $dtype batch $batch seq $seq steps $steps${flags:+ $flags}): compared"
done <"$tmp/runs"

# 2. a sweep with each build
if [ $sweep = 1 ]; then
  [ -z "$olddb" ] || cp "$olddb" "$tmp/old.db" || exit 2
  for side in old new; do
    [ $side = old ] && [ -n "$olddb" ] && continue
    b=$OLD; [ $side = new ] && b=$NEW
    start=$(date +%s)
    "$b/bench/shardbench" sweep --world "$world" --dtypes "$dtypes" --plans-dir "$SRC/plans" \
      --db "$tmp/$side.db" >"$tmp/$side-sweep.out" 2>&1
    rc=$?
    [ $rc -le 1 ] || differ "the $side sweep exited $rc: $(tail -1 "$tmp/$side-sweep.out")"
    echo "$side sweep: exit $rc, $(( $(date +%s) - start )) s"
  done
  q="SELECT c.key, r.status, coalesce(r.reason,''), quote(r.max_abs_err), quote(r.max_rel_err)
     FROM results r JOIN configs c ON c.id = r.config_id ORDER BY c.key;"
  qc="SELECT c.key, m.op, m.mesh_dim, m.phase, m.calls, m.payload_bytes, quote(m.wire_bytes)
      FROM comm m JOIN results r ON r.id = m.result_id JOIN configs c ON c.id = r.config_id
      ORDER BY c.key, m.op, m.mesh_dim, m.phase;"
  for side in old new; do
    sqlite3 -separator ' | ' "$tmp/$side.db" "$q" | sed 's|: [^ :]*/\([^/ :]*\.plan\)|: \1|' >"$tmp/$side.res"
    sqlite3 -separator ' | ' "$tmp/$side.db" "$qc" >"$tmp/$side.comm"
  done
  echo "results: $(wc -l <"$tmp/old.res") old, $(wc -l <"$tmp/new.res") new;" \
    "ok: $(grep -c ' | ok | ' "$tmp/old.res") old, $(grep -c ' | ok | ' "$tmp/new.res") new"
  if ! cmp -s "$tmp/old.res" "$tmp/new.res"; then
    diff "$tmp/old.res" "$tmp/new.res" | head -40
    differ "sweep results differ ($(diff "$tmp/old.res" "$tmp/new.res" | grep -c '^>') rows)"
  fi
  if ! cmp -s "$tmp/old.comm" "$tmp/new.comm"; then
    diff "$tmp/old.comm" "$tmp/new.comm" | head -40
    differ "sweep comm rows differ ($(diff "$tmp/old.comm" "$tmp/new.comm" | grep -c '^>') rows)"
  fi
fi
if [ -n "$keep" ]; then mkdir -p "$keep" && cp "$tmp"/*.db "$tmp"/*.res "$tmp"/*.comm "$keep"/ 2>/dev/null; fi
echo "compare-builds: $diffs differences"
[ $diffs -eq 0 ]
