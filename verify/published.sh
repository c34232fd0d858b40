#!/bin/sh
# verify/published.sh: the capacity planner against published runs, in make check.
# bench/published-check.py predicts every row of results/published-layouts.csv that is
# quick to run shape-only (the 405B pipelined rows, 26 s, are left to the bench command
# `bench/published-check.py`), on the shipped hardware files, and fails when a prediction
# leaves the goals: tokens/s per GPU median |ln(predicted / published)| <= 0.15 and every
# row within 1.5x, memory within 15% (rows marked miss excepted; the layouts file says why).
# The oracle is the published numbers (TorchTitan's benchmark files). It then shows the
# check can fail: the same predictions against a layouts file with one published value
# halved must be refused. results/published-check.txt is the whole table as last recorded
# (bench/published-check.py --table results/published-check.txt).
NAME=published
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null || { echo "SKIP: $NAME: no python3 (scripts/install-deps installs it)"; exit 77; }
T=$tmp
pass() { checks=$((checks + 1)); echo "ok: $*"; }
CHECK="${srcdir:-.}/bench/published-check.py"
LAYOUTS="${srcdir:-.}/results/published-layouts.csv"
FAST=$(grep -v '^#' "$LAYOUTS" | grep -v '^t5-\|^t6-' | cut -d';' -f1 | paste -sd, -)
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
finish
