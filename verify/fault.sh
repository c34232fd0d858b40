#!/bin/sh
# verify/fault.sh: the verdict of `shardbench run` and `sweep` can fail, end to end (make check).
#
# SHARDBENCH_FAULT (a test switch of bench/harness/run.c) breaks the sharded job on
# purpose; the unsharded reference stays right. On a small config (mesh
# dp_replicate:2,tp:2, the 1-layer block workload, batch 4, seq 8, 1 warm-up + 1
# timed step, f32):
#   control       no fault: exit 0, status ok, `worst` named (JSON and DB row),
#                 max_rel_err <= tolerance
#   skip-reduce   layers.0.attention.wq.weight's gradient skips the data-parallel
#                 all-reduce (each dp replica keeps its own part)
#   perturb-grad  1e-3 of the shard's scale added to one rank's local shard of a
#                 gradient after the reduce: rank 3 (outside rank 0's dp replica,
#                 so only a check on every rank names it) and rank 1 on the
#                 replicated norm.weight
# each fault: exit 1, status mismatch, `worst` names the faulted parameter in the
# JSON, in the text summary and in the DB row (--db), the reason counts every
# compared quantity (COMPARED, derived below), and one warning line on stderr
# names the fault. A malformed switch is refused like a bad flag (exit 2,
# one line, nothing run, no DB); a parameter the model lacks fails the config.
# Sweep level: a world-2 sweep of plan dp with skip-reduce on output.weight
# records exactly one mismatch row (dp_replicate:2) naming it; without the fault
# the same sweep has that row ok.
# Program: ${top_builddir:-.}/bench/shardbench; plans: ${srcdir:-.}/plans.
# Skips (77) when the sqlite3 CLI is missing (scripts/install-deps installs it).

NAME=fault.sh
. "$(dirname "$0")/harness-common.sh"
unset SHARDBENCH_FAULT
json() { # json FIELD FILE: a string field of the one-line JSON ("null" when null)
  v=$(sed -n 's/.*"'"$1"'": "\([^"]*\)".*/\1/p' "$2")
  if [ -n "$v" ]; then echo "$v"; else sed -n 's/.*"'"$1"'": \(null\).*/\1/p' "$2"; fi
}

CONFIG="--mesh dp_replicate:2,tp:2 --workload block --batch 4 --seq 8 --steps 1 --warmup 1 --plans-dir $PLANS"
# What the verdict compares for CONFIG: the block has 9 weights per layer + tok_embeddings,
# norm, output = 12; each of the 2 steps has a loss and 12 gradients, then the 12 weights.
COMPARED=$((2 * (1 + 12) + 12))

# run_case NAME FAULT: one JSON run and one text run with --db; results in $tmp/NAME.*
run_case() {
  # shellcheck disable=SC2086
  SHARDBENCH_FAULT=$2 "$SB" run $CONFIG --json >"$tmp/$1.json" 2>"$tmp/$1.err"
  echo $? >"$tmp/$1.rc"
  # shellcheck disable=SC2086
  SHARDBENCH_FAULT=$2 "$SB" run $CONFIG --db "$tmp/$1.db" >"$tmp/$1.txt" 2>"$tmp/$1.err2"
  echo $? >"$tmp/$1.rc2"
}

# ---- control ------------------------------------------------------------------------
run_case control ""
check "control: exit" "$(cat "$tmp/control.rc") $(cat "$tmp/control.rc2")" "0 0"
check "control: status" "$(json status "$tmp/control.json")" ok
w=$(json worst "$tmp/control.json")
checks=$((checks + 1))
case "$w" in *" grad step "* | *" param after step "* | "loss step "*) ;;
  *) fail "control: worst '$w' names no compared quantity" ;; esac
check "control: no stderr" "$(cat "$tmp/control.err")" ""
check "control: DB row ok, worst named, within tolerance" \
  "$(q "$tmp/control.db" "SELECT status, worst IS NOT NULL AND worst != '', max_rel_err <= tolerance FROM results")" \
  "ok|1|1"
echo "control: ok, worst $w"

# ---- faults -------------------------------------------------------------------------
fault_case() { # fault_case NAME FAULT PARAM
  run_case "$1" "$2"
  check "$1: exit" "$(cat "$tmp/$1.rc") $(cat "$tmp/$1.rc2")" "1 1"
  check "$1: status" "$(json status "$tmp/$1.json")" mismatch
  w=$(json worst "$tmp/$1.json")
  checks=$((checks + 1))
  case "$w" in "$3 grad step "* | "$3 param after step "*) ;;
    *) fail "$1: worst '$w' does not name $3" ;; esac
  check "$1: the text summary names it" "$(grep -c "^  worst: $3 " "$tmp/$1.txt")" 1
  check "$1: DB row" "$(q "$tmp/$1.db" "SELECT status, worst LIKE '$3 %', max_rel_err > tolerance FROM results")" \
    "mismatch|1|1"
  check "$1: every quantity compared" "$(json reason "$tmp/$1.json" | grep -c " of $COMPARED compared ")" 1
  check "$1: one warning line naming the fault" \
    "$(wc -l <"$tmp/$1.err" | tr -d ' ') $(grep -c "SHARDBENCH_FAULT=$2" "$tmp/$1.err")" "1 1"
  echo "$1: $(json reason "$tmp/$1.json")"
}
fault_case skip-reduce "skip-reduce:layers.0.attention.wq.weight" layers.0.attention.wq.weight
fault_case perturb-rank3 "perturb-grad:layers.0.feed_forward.w2.weight:3" layers.0.feed_forward.w2.weight
fault_case perturb-norm "perturb-grad:norm.weight:1" norm.weight

# ---- a malformed switch is a bad flag; an unknown parameter fails the config ----------
for f in "skip-reduce" "perturb-grad:norm.weight" "skip-reduce:norm.weight:1" "drop:norm.weight" \
  "perturb-grad:norm.weight:x"; do
  # shellcheck disable=SC2086
  refused "malformed '$f'" SHARDBENCH_FAULT env SHARDBENCH_FAULT="$f" "$SB" run $CONFIG --db "$tmp/bad.db"
done
checks=$((checks + 1))
[ -e "$tmp/bad.db" ] && fail "a refused switch created the DB"
# shellcheck disable=SC2086
SHARDBENCH_FAULT=skip-reduce:nosuch.weight "$SB" run $CONFIG --json >"$tmp/o" 2>/dev/null
check "unknown parameter: exit and status" "$? $(json status "$tmp/o")" "1 failed"
checks=$((checks + 1))
grep -q "no parameter 'nosuch.weight'" "$tmp/o" || fail "unknown parameter: reason '$(json reason "$tmp/o")'"

# ---- sweep level ----------------------------------------------------------------------
SWEEP="--world 2 --plans-dir $PLANS --plans dp --workloads block --dtypes f32 --batch 4 --seq 8 --steps 1 --warmup 0"
ROW="SELECT r.status || ' ' || coalesce(r.worst, '') FROM results r JOIN configs c ON c.id = r.config_id WHERE c.dp_replicate = 2"
# shellcheck disable=SC2086
"$SB" sweep $SWEEP --db "$tmp/sweep-ok.db" >/dev/null 2>&1
check "sweep control: exit" "$?" 0
checks=$((checks + 1))
case "$(q "$tmp/sweep-ok.db" "$ROW")" in "ok "?*) ;;
  *) fail "sweep control: dp_replicate:2 row '$(q "$tmp/sweep-ok.db" "$ROW")', expected ok with worst" ;; esac
# shellcheck disable=SC2086
SHARDBENCH_FAULT=skip-reduce:output.weight "$SB" sweep $SWEEP --db "$tmp/sweep.db" >/dev/null 2>"$tmp/e"
check "sweep fault: exit" "$?" 1
check "sweep fault: one mismatch row" "$(q "$tmp/sweep.db" "SELECT count(*) FROM results WHERE status = 'mismatch'")" 1
check "sweep fault: the others skipped" \
  "$(q "$tmp/sweep.db" "SELECT count(*) FROM results WHERE status NOT IN ('mismatch', 'skipped')")" 0
checks=$((checks + 1))
case "$(q "$tmp/sweep.db" "$ROW")" in "mismatch output.weight "*) ;;
  *) fail "sweep fault: dp_replicate:2 row '$(q "$tmp/sweep.db" "$ROW")'" ;; esac
check "sweep fault: one warning line" "$(grep -c "SHARDBENCH_FAULT=skip-reduce:output.weight" "$tmp/e")" 1

finish
