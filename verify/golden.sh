#!/bin/sh
# verify/golden.sh: shardbench's unsharded Llama reference against PyTorch's numbers,
# without torch: verify/golden/debugmodel.json holds what verify/torch/oracle.py
# computed with PyTorch from shardbench's own initial weights and token batches
# (losses, every gradient, the updated weights, as checksums and samples), and
# PyTorch's DTensor collective counts for the shipped TP plans. Checks:
#   1. each golden run, with its settings as flags (TorchTitan's recipe: --max-norm,
#      --global-batch, --lr-*; activation checkpointing: --ac; golden_check list):
#      `shardbench run --world 1 ... --save-trace --save-weights --json`, then
#      `golden_check check` (tolerances and their reasons: verify/golden_check.c);
#      first the run's inputs (initial weights, token batches) must be the ones the
#      golden was made from, else it says STALE (regenerate), not a model drift;
#      and `golden_check job`: the run's verdict ok, and an AC run's job bitwise
#      the reference the trace is of (the reference runs without AC);
#   2. it can fail: the same run from weights with one element of
#      layers.0.attention.wq.weight scaled by 1.01 (--load-weights), and the same
#      run with RoPE base 10000 instead of Llama 3's 500000, must both be off; given
#      the perturbed weights file as the run's weights, it says STALE instead; the
#      first recipe run with twice its --max-norm must be off; the first AC run
#      with SHARDBENCH_FAULT=ac-zero:3 (its recomputed blocks wrong) must fail
#      golden_check job;
#   3. each (plan, tp) of the golden's comm rows: `shardbench run --json` ledger
#      counts per op and phase equal PyTorch's CommDebugMode counts (over the
#      row's pytorch_calls_per_reduction where PyTorch repeats one reduction; the
#      row's note says why); megatron-tp's ledger against torchtitan-tp-sp's rows
#      must be off.
#   4. bad input: a golden run with a setting golden_check does not know, or a
#      newer format version, is refused by golden_check list (exit 2, one line).
# Regenerating the golden file (needs torch): make check-torch GOLDEN=1.
NAME=golden
. "${srcdir:-.}/verify/harness-common.sh"

GC="${top_builddir:-.}/verify/golden_check"
GOLDEN="${srcdir:-.}/verify/golden/debugmodel.json"
[ -x "$GC" ] || { echo "$NAME: $GC is not built" >&2; exit 99; }
[ -r "$GOLDEN" ] || { echo "$NAME: no $GOLDEN" >&2; exit 99; }

"$GC" list "$GOLDEN" >"$tmp/runs" || { echo "$NAME: cannot read $GOLDEN" >&2; exit 99; }
[ -s "$tmp/runs" ] || fail "the golden file has no runs"
# a golden run with a setting this golden_check cannot pass on, or a newer format: refused
sed 's/"ac": "full"/"ac": "full", "fsdp": 2/' "$GOLDEN" >"$tmp/bad.json"
refused "a golden run with an unknown setting" "setting 'fsdp' unknown" "$GC" list "$tmp/bad.json"
sed 's/"version": 2,/"version": 99,/' "$GOLDEN" >"$tmp/bad.json"
refused "a newer golden format" "format version 99" "$GC" list "$tmp/bad.json"

trace() { # trace OUT MODEL DTYPE BATCH SEQ STEPS [extra run flags]
  out=$1 model=$2 dtype=$3 batch=$4 seq=$5 steps=$6
  shift 6
  "$SB" run --world 1 --plans-dir "$PLANS" --model "$model" --dtype "$dtype" --batch "$batch" \
    --seq "$seq" --warmup 0 --steps "$steps" --save-trace "$out" "$@" >"$tmp/run.out" 2>"$tmp/run.err"
}
run_tail() { tail -3 "$tmp/run.err" "$tmp/run.out" 2>/dev/null; }

# 1. every golden run; $flags (golden_check's words, no spaces in any) split on purpose
while read -r i model dtype batch seq steps flags; do
  checks=$((checks + 1))
  # shellcheck disable=SC2086
  if ! trace "$tmp/t$i.st" "$model" "$dtype" "$batch" "$seq" "$steps" --save-weights "$tmp/w$i.st" \
    --json $flags; then
    fail "run $i ($model $dtype$flags): $(run_tail)"
    continue
  fi
  cp "$tmp/run.out" "$tmp/j$i.json"
  "$GC" check "$GOLDEN" "$i" "$tmp/t$i.st" "$tmp/w$i.st" >"$tmp/gc.out" 2>&1
  case $? in
    0) ;;
    3) fail "run $i: the golden file is stale, not the model: $(tail -1 "$tmp/gc.out")" ;;
    *) fail "run $i: $(cat "$tmp/gc.out")" ;;
  esac
  "$GC" job "$GOLDEN" "$i" "$tmp/j$i.json" >>"$tmp/gc.out" 2>&1 || fail "run $i: $(tail -2 "$tmp/gc.out")"
  [ -z "$flags" ] || echo "  golden run $i's settings:$flags"
  sed 's/^/  /' "$tmp/gc.out"
done <"$tmp/runs"

# 2. the check can fail: a planted wrong weight, a wrong RoPE base (golden run 0)
off() { # off WHAT I TRACE: golden run I against TRACE must be off (golden_check exit 1)
  "$GC" check "$GOLDEN" "$2" "$3" >"$tmp/gc.out" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "$1: golden_check exit $rc, expected 1: $(cat "$tmp/gc.out")"
  echo "  $1: $(tail -1 "$tmp/gc.out")"
}
read -r i model dtype batch seq steps flags <"$tmp/runs"
[ -z "$flags" ] || fail "golden run 0 has settings ($flags): the planted cases below want a plain run"
if [ -s "$tmp/w0.st" ]; then
  checks=$((checks + 1))
  if "$GC" perturb "$tmp/w0.st" "$tmp/wp.st" layers.0.attention.wq.weight 0 1.01 &&
    trace "$tmp/tp.st" "$model" "$dtype" "$batch" "$seq" "$steps" --load-weights "$tmp/wp.st"; then
    off "perturbed weight" 0 "$tmp/tp.st"
    # given the perturbed weights file too, it is told apart: the inputs changed (stale)
    checks=$((checks + 1))
    "$GC" check "$GOLDEN" 0 "$tmp/tp.st" "$tmp/wp.st" >"$tmp/gc.out" 2>&1
    rc=$?
    { [ $rc -eq 3 ] && grep -q "STALE" "$tmp/gc.out"; } ||
      fail "perturbed inputs given: golden_check exit $rc, expected 3 (stale): $(cat "$tmp/gc.out")"
  else
    fail "could not run from the perturbed weights: $(run_tail)"
  fi
else
  fail "run 0 wrote no weights"
fi
checks=$((checks + 1))
if trace "$tmp/tr.st" "$model:rope_theta=10000" "$dtype" "$batch" "$seq" "$steps"; then
  off "RoPE base 10000" 0 "$tmp/tr.st"
else
  fail "could not run with rope_theta=10000: $(run_tail)"
fi

# the recipe and AC runs can fail: the first recipe run with twice its max_norm (it still
# clips, by another factor: step 0 and its norm agree, every later quantity moves), and
# the first AC run with its recomputed blocks wrong (SHARDBENCH_FAULT=ac-zero:3)
first_run() { # first_run PATTERN: i model dtype batch seq steps rest of the first golden run
  # whose line has PATTERN (rest: its flags); 1 when none has
  grep -m1 -e "$1" "$tmp/runs" >"$tmp/line" && read -r i model dtype batch seq steps rest <"$tmp/line"
}
checks=$((checks + 1))
if first_run --max-norm; then
  flags='' doubled='' prev=''
  for w in $rest; do
    if [ "$prev" = --max-norm ]; then
      doubled=$(awk -v x="$w" 'BEGIN { printf "%.17g", 2 * x }')
      w=$doubled
    fi
    flags="$flags $w" prev=$w
  done
  # shellcheck disable=SC2086
  if trace "$tmp/tm.st" "$model" "$dtype" "$batch" "$seq" "$steps" $flags; then
    off "recipe run $i at --max-norm $doubled" "$i" "$tmp/tm.st"
  else
    fail "could not run run $i at --max-norm $doubled: $(run_tail)"
  fi
else
  fail "the golden file has no recipe run (--max-norm)"
fi
checks=$((checks + 1))
if first_run --ac; then
  # a subshell: a shell may keep an assignment made before a function call
  # shellcheck disable=SC2086
  (SHARDBENCH_FAULT='ac-zero:3' && export SHARDBENCH_FAULT &&
    trace "$tmp/ta.st" "$model" "$dtype" "$batch" "$seq" "$steps" --json $rest)
  "$GC" job "$GOLDEN" "$i" "$tmp/run.out" >"$tmp/gc.out" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "run $i with ac-zero:3: golden_check job exit $rc, expected 1: $(cat "$tmp/gc.out")"
  echo "  AC run $i with ac-zero:3: $(head -1 "$tmp/gc.out")"
else
  fail "the golden file has no AC run (--ac)"
fi

# 3. collective counts against PyTorch's
comm_run() { # comm_run PLAN TP OUT
  "$SB" run --plans-dir "$PLANS" --plan "$1" --tp "$2" --dtype f32 --batch 8 --seq 32 --warmup 0 \
    --steps 1 --json >"$3" 2>"$tmp/run.err"
}
"$GC" comm-list "$GOLDEN" >"$tmp/comm" || fail "the golden file's comm rows are unreadable"
[ -s "$tmp/comm" ] || fail "the golden file has no comm rows"
while read -r plan tp; do
  checks=$((checks + 1))
  if ! comm_run "$plan" "$tp" "$tmp/c.json"; then
    fail "$plan tp $tp: $(cat "$tmp/run.err")"
    continue
  fi
  "$GC" comm "$GOLDEN" "$plan" "$tp" "$tmp/c.json" >"$tmp/gc.out" 2>&1 || fail "$(cat "$tmp/gc.out")"
  sed 's/^/  /' "$tmp/gc.out"
done <"$tmp/comm"
checks=$((checks + 1))
if comm_run megatron-tp 2 "$tmp/m.json"; then
  "$GC" comm "$GOLDEN" torchtitan-tp-sp 2 "$tmp/m.json" >"$tmp/gc.out" 2>&1
  rc=$?
  [ $rc -eq 1 ] || fail "megatron-tp's ledger passed as torchtitan-tp-sp's (exit $rc)"
else
  fail "megatron-tp tp 2: $(cat "$tmp/run.err")"
fi
finish
