#!/bin/sh
# verify/published.sh: the capacity planner against published runs, in make check.
# bench/published-check.py predicts every row of results/published-layouts.csv (shape-only
# runs, about 8 s), on the shipped hardware files, and fails when a prediction leaves the
# goals: tokens/s per GPU median |ln(predicted / published)| <= 0.15 and every row within
# 1.5x, memory within 15% (rows marked miss excepted; the layouts file says why).
# The oracle is the published numbers (TorchTitan's benchmark files). It then shows the
# check can fail: the same predictions against a layouts file with one published value
# halved must be refused. Each row's plan is one of plans/published/ and its ac column
# must be that plan's activation_checkpoint_mode (the prediction runs at the plan's own
# AC): a copy of the plans with t1-fsdp's plan at `none` must be refused (exit 2, one
# line naming the row) before any prediction, and so must one that states no AC.
# results/published-check.txt is the whole table as last recorded
# (bench/published-check.py --table results/published-check.txt).
NAME=published
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null || { echo "SKIP: $NAME: no python3 (scripts/install-deps installs it)"; exit 77; }
T=$tmp
pass() { checks=$((checks + 1)); echo "ok: $*"; }
CHECK="${srcdir:-.}/bench/published-check.py"
LAYOUTS="${srcdir:-.}/results/published-layouts.csv"
FAST=$(grep -v '^#' "$LAYOUTS" | cut -d';' -f1 | paste -sd, -)
if python3 "$CHECK" --shardbench "$SB" --layouts "$LAYOUTS" --only "$FAST" --save "$T/pred.json" \
    >"$T/out" 2>&1; then
  pass "published rows within the goals: $(grep '^tokens/s' "$T/out")"
else
  checks=$((checks + 1))
  fail "published rows: $(grep -i 'FAIL\|error\|exit' "$T/out" | head -5)"
fi
cat "$T/out"
# planted: t1-fsdp's published tokens/s halved (the prediction then reads 2x over)
awk -F';' 'BEGIN{OFS=";"} $1=="t1-fsdp"{$12=$12/2} {print}' "$LAYOUTS" >"$T/planted.csv"
if python3 "$CHECK" --layouts "$T/planted.csv" --only "$FAST" --load "$T/pred.json" >"$T/planted" 2>&1; then
  checks=$((checks + 1))
  fail "a published value halved was not caught"
else
  if grep -q "t1-fsdp: tokens/s ratio" "$T/planted"; then
    pass "a published value halved fails the check"
  else
    checks=$((checks + 1))
    fail "planted: $(tail -2 "$T/planted")"
  fi
fi
# planted: t1-fsdp's plan with the wrong AC (none), then with none stated; the row's ac stays
mkdir -p "$T/plans"
cp -R "${srcdir:-.}/plans/published" "$T/plans/published"
chmod -R u+w "$T/plans"
P1="$T/plans/published/$(awk -F';' '$1=="t1-fsdp"{print $7}' "$LAYOUTS").plan"
planted_ac() { # planted_ac WHAT PATTERN: the check refuses the layouts with the edited plan
  python3 "$CHECK" --layouts "$LAYOUTS" --plans-dir "$T/plans" --only "$FAST" --load "$T/pred.json" \
    >"$T/ac.out" 2>"$T/ac.err"
  rc=$?
  checks=$((checks + 1))
  if [ $rc -eq 2 ] && [ "$(wc -l <"$T/ac.err")" -eq 1 ] && [ ! -s "$T/ac.out" ] &&
      grep -q -e "$2" "$T/ac.err"; then
    echo "ok: $1 is refused: $(cat "$T/ac.err")"
  else
    fail "$1: exit $rc, stderr $(head -c 300 "$T/ac.err"), stdout $(wc -c <"$T/ac.out") B"
  fi
}
if [ -f "$P1" ] && grep -q '^activation_checkpoint_mode = selective$' "$P1"; then
  sed -i.orig -e 's/^activation_checkpoint_mode = selective$/activation_checkpoint_mode = none/' \
    -e '/^selective_ac_option/d' "$P1"
  planted_ac "t1-fsdp's plan at AC none" "t1-fsdp: ac 'selective:op' differs from plan .*'none'"
  grep -v '^activation_checkpoint_mode' "$P1.orig" >"$P1"
  planted_ac "t1-fsdp's plan without an AC" "t1-fsdp: plan .* states no activation_checkpoint_mode"
else
  checks=$((checks + 1))
  fail "t1-fsdp's plan $P1 is missing or not at selective AC"
fi
finish
