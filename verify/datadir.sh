#!/bin/sh
# verify/datadir.sh: where shardbench finds plans/, scripts/ and results/ at run
# time (bench/harness/datadir.h): the flag, $SHARDBENCH_PLANS / $SHARDBENCH_SCRIPTS,
# $SHARDBENCH_DATADIR, ./<sub> when it holds the files, <exe>/../share/shardbench
# (a copy of the program in a tree laid out as installed), then the configured
# $(pkgdatadir) ($SB_PKGDATADIR, exported by make check).
#
# Every candidate directory of a case holds the kind's files, so only the order
# decides. The oracle is the path the program names: `run --plan nosuch` fails
# (exit 2, before any work) with "no plan file 'DIR/nosuch.plan'", `report` logs
# each gnuplot command with its script path (gnuplot.log; GNUPLOT=/bin/true draws
# nothing), `baselines --db` names the published.csv it cannot read. Each case
# also checks that the next candidate in the order is NOT the one named, which
# is what makes each case able to fail.
set -u
NAME=datadir
SRC=$(cd "${srcdir:-.}" && pwd) || exit 99
SB0="${top_builddir:-.}/bench/shardbench"
[ -x "$SB0" ] || { echo "$NAME: $SB0 is not built" >&2; exit 99; }
SB="$(cd "$(dirname "$SB0")" && pwd)/$(basename "$SB0")"
PKGDATA=${SB_PKGDATADIR:-}
[ -n "$PKGDATA" ] || { echo "$NAME: SB_PKGDATADIR is not set (run through make check)" >&2; exit 99; }

T=$(mktemp -d "${TMPDIR:-/tmp}/sb-datadir.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# A data root laid out as $(pkgdatadir): plans (all shipped), scripts, results.
mkroot() {
  mkdir -p "$1/plans" "$1/scripts" "$1/results"
  cp "$SRC"/plans/*.plan "$1/plans/"
  cp "$SRC"/scripts/*.gp "$1/scripts/"
  cp "$SRC/results/schema.sql" "$1/results/"
}
for d in flag envp envs root cwd; do mkroot "$T/$d"; done
# the tree of an installed copy: bin/shardbench next to share/shardbench
mkdir -p "$T/reloc/bin" "$T/reloc/share"
cp "$SB" "$T/reloc/bin/shardbench"
mkroot "$T/reloc/share/shardbench"
RSB="$T/reloc/bin/shardbench"
mkdir -p "$T/empty/plans"  # a ./plans without *.plan files does not count
echo "not a plan" >"$T/empty/plans/README.md"

CLEAN="env -u SHARDBENCH_PLANS -u SHARDBENCH_SCRIPTS -u SHARDBENCH_DATADIR"

# plans CASE WANT NOT CWD PROG [VAR=VALUE...] -- [FLAGS...]: `run --plan nosuch`
# from CWD must name WANT/nosuch.plan, not NOT/nosuch.plan.
plans() {
  case_=$1 want=$2 not=$3 cwd=$4 prog=$5
  shift 5
  vars=""
  while [ "$1" != -- ]; do vars="$vars $1"; shift; done
  shift
  # shellcheck disable=SC2086 # vars is a list of words on purpose
  (cd "$cwd" && $CLEAN $vars "$prog" run --plan nosuch --tp 2 --world 2 --workload block \
    --batch 2 --seq 4 --steps 1 "$@") >"$T/out" 2>"$T/err"
  rc=$?
  if [ $rc -ne 2 ]; then
    fail "plans $case_: exit $rc, expected 2: $(head -c 300 "$T/err")"
  elif ! grep -qF "'$want/nosuch.plan'" "$T/err"; then
    fail "plans $case_: expected $want, got: $(cat "$T/err")"
  elif grep -qF "'$not/nosuch.plan'" "$T/err"; then
    fail "plans $case_: named $not, the next candidate"
  else
    pass "plans $case_: $want"
  fi
}

plans flag "$T/flag/plans" "$T/envp/plans" "$T/cwd" "$SB" \
  SHARDBENCH_PLANS="$T/envp/plans" SHARDBENCH_DATADIR="$T/root" -- --plans-dir "$T/flag/plans"
plans SHARDBENCH_PLANS "$T/envp/plans" "$T/root/plans" "$T/cwd" "$SB" \
  SHARDBENCH_PLANS="$T/envp/plans" SHARDBENCH_DATADIR="$T/root" --
plans SHARDBENCH_DATADIR "$T/root/plans" "plans" "$T/cwd" "$SB" SHARDBENCH_DATADIR="$T/root" --
plans ./plans "plans" "$T/reloc/share/shardbench/plans" "$T/cwd" "$RSB" --
plans exe-relative "$T/reloc/share/shardbench/plans" "$PKGDATA/plans" "$T/empty" "$RSB" --
# the build tree's program has no share/ above it: the configured $(pkgdatadir)
plans pkgdatadir "$PKGDATA/plans" "plans" "$T/empty" "$SB" --

# a real run by the moved copy, with nothing but its own tree to find plans in
if (cd "$T/empty" && $CLEAN "$RSB" run --tp 2 --world 2 --workload block --batch 2 --seq 4 \
    --steps 1 --warmup 0 --db "$T/r.db") >"$T/out" 2>"$T/err" && grep -q 'status: ok' "$T/out"; then
  pass "the moved copy runs with its own plans"
else
  fail "the moved copy: $(cat "$T/err")"
fi

# scripts: the path of comm.gp in gnuplot.log, from the DB of the run above
scripts() {
  case_=$1 want=$2 not=$3 cwd=$4 prog=$5
  shift 5
  rm -rf "$T/rep"
  # shellcheck disable=SC2086 # the variables are words on purpose
  (cd "$cwd" && $CLEAN GNUPLOT=/bin/true "$@" "$prog" report --db "$T/r.db" --out "$T/rep") \
    >/dev/null 2>"$T/err"
  if ! grep -qF " $want/comm.gp" "$T/rep/gnuplot.log" 2>/dev/null; then
    fail "scripts $case_: expected $want/comm.gp, got: $(cat "$T/rep/gnuplot.log" "$T/err" 2>/dev/null | head -3)"
  elif grep -qF " $not/comm.gp" "$T/rep/gnuplot.log"; then
    fail "scripts $case_: ran $not/comm.gp, the next candidate"
  else
    pass "scripts $case_: $want"
  fi
}
if [ -s "$T/r.db" ]; then
  scripts SHARDBENCH_SCRIPTS "$T/envs/scripts" "$T/root/scripts" "$T/cwd" "$SB" \
    SHARDBENCH_SCRIPTS="$T/envs/scripts" SHARDBENCH_DATADIR="$T/root"
  scripts SHARDBENCH_DATADIR "$T/root/scripts" "scripts" "$T/cwd" "$SB" SHARDBENCH_DATADIR="$T/root"
  scripts ./scripts "scripts" "$T/reloc/share/shardbench/scripts" "$T/cwd" "$RSB"
  scripts exe-relative "$T/reloc/share/shardbench/scripts" "$PKGDATA/scripts" "$T/empty" "$RSB"
else
  fail "no results DB from the run: the scripts cases did not run"
fi

# results: baselines --db reads DIR/results/published.csv, DIR being the first
# candidate that holds schema.sql (the probe); the candidates hold schema.sql only,
# so the error names the published.csv it chose.
results() {
  case_=$1 want=$2 not=$3 cwd=$4 prog=$5
  shift 5
  rm -f "$T/b.db"
  # shellcheck disable=SC2086
  (cd "$cwd" && $CLEAN "$@" "$prog" baselines --model debugmodel --tp 2 --batch 8 --seq 64 \
    --db "$T/b.db") >/dev/null 2>"$T/err"
  rc=$?
  if [ $rc -eq 0 ]; then
    fail "results $case_: exit 0 without a published.csv"
  elif ! grep -qF -- "--published: cannot read '$want/published.csv'" "$T/err"; then
    fail "results $case_: expected $want/published.csv, got: $(cat "$T/err")"
  elif grep -qF -- "cannot read '$not/published.csv'" "$T/err"; then
    fail "results $case_: named $not, the next candidate"
  else
    pass "results $case_: $want"
  fi
}
results SHARDBENCH_DATADIR "$T/root/results" "results" "$T/cwd" "$SB" SHARDBENCH_DATADIR="$T/root"
results ./results "results" "$T/reloc/share/shardbench/results" "$T/cwd" "$RSB"
results exe-relative "$T/reloc/share/shardbench/results" "$PKGDATA/results" "$T/empty" "$RSB"

if [ $fails -ne 0 ]; then
  echo "$NAME: $fails failure(s)"
  exit 1
fi
echo "$NAME: all checks passed"
exit 0
