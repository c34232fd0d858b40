#!/bin/sh
# verify/clip.sh: TorchTitan's training recipe in the step, end to end through
# `shardbench run`: gradient-norm clipping (training.max_norm, clip_grad_norm_ over
# every mesh dim), gradient accumulation and the lr schedule. The clipping runs use
# a max_norm small enough that every step clips (the debugmodel's norm is ~2 to 3):
#   1. TP + SP, FSDP x TP, HSDP, CP (FSDP x CP), PP x TP and 5-D (five-d.sh's config,
#      f32 only) each verify against the unsharded reference, which clips the same
#      way: every step's loss, gradients and total norm, the final weights; the
#      reported norm is above max_norm (clipping engaged);
#   2. the norm's collectives: the optimizer-phase all_reduces a run with clipping
#      adds to the same run without, per mesh dim, equal the count derived here
#      from the gradients' placements (one f64 all_reduce per non-pp dim that
#      shards some gradient, of one element per distinct set of shard dims
#      containing it; one of one element over pp);
#   3. it can fail: the replicated final norm weight counted once per rank of the
#      dims it is Replicate on (SHARDBENCH_FAULT=norm-replicated:norm.weight), and
#      pp rank 1's stages left out (norm-drop-stage:1), are each a mismatch naming
#      "grad_norm step 0";
#   4. gradient accumulation (--global-batch) under TP + SP, FSDP, HSDP, FSDP x TP,
#      DDP x CP, PP x DDP and PP x FSDP (each microstep one pipeline step of the
#      schedule's microbatches): two microsteps of 4 give one step of 8's norm (the
#      oracle), and the data-parallel reductions run per microstep;
#   5. TorchTitan's lr schedule over 8 steps with clipping (and accumulation) under
#      TP + SP, FSDP, HSDP, FSDP x TP, CP and PP x TP verifies against the reference;
#   6. the plan setting max_norm clips as --max-norm does (the same norm), and bad
#      values of the flags and the setting are refused with exit 2 (the flag;
#      FILE:LINE).
NAME=clip
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

MAXN=0.01
# two layers (the pipeline's stages still hold some each); the MFU peak given, not measured
SMALL="--model debugmodel:n_layers=2"
run() { "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 1 --peak-tflops 1 --json "$@" 2>"$tmp/e"; }

# The extra optimizer all_reduces per mesh dim, from the shard-dim sets of the
# gradients (argv: "pp" or "", then the sets, each a comma list; an all-Replicate
# gradient adds none): [(dim, (calls, payload bytes))].
derive() {
  python3 - "$@" <<'PY'
import sys
pp = sys.argv[1] == "pp"
sets = [frozenset(s.split(",")) - {""} for s in sys.argv[2:]]
sets = list(dict.fromkeys(sets))
out = {}
for d in sorted(set().union(*sets)):
    n = sum(1 for s in sets if d in s)
    out[d] = (1, 8 * n)
if pp:
    out["pp"] = (1, 8)
print(sorted(out.items()))
PY
}

# The optimizer all_reduce rows of run JSON $2 minus those of $1: [(dim, (calls, bytes))].
extra() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def rows(p):
    d = json.load(open(p))
    return {c["mesh_dim"]: (c["calls"], c["payload_bytes"]) for c in d["comm"]
            if c["op"] == "all_reduce" and c["phase"] == "optimizer"}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
out = {}
for k in b:
    ca, pa = a.get(k, (0, 0))
    if b[k] != (ca, pa):
        out[k] = (b[k][0] - ca, b[k][1] - pa)
print(sorted(out.items()))
PY
}

verdict() { # JSON -> "status norm>max_norm compared>0"
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
g = d["grad_norm"]
print(d["status"], g is not None and g > float(sys.argv[2]), d["compared"] > 0)' "$1" "$MAXN"
}

# name | flags | pp? | the gradients' shard-dim sets (from the plan's placements)
# TP + SP: the TP-sharded weights on tp; the norms Replicate.
# FSDP x TP: FSDP shards every weight over dp_shard, TP's on tp too.
# HSDP: FSDP over dp_shard; dp_replicate replicates.
# FSDP x CP: FSDP shards over dp_shard x cp (both dims).
# PP x TP: as TP + SP, each stage its own; then pp.
while IFS='|' read -r name flags pp sets; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086 # flags is a list
  if ! run $SMALL $flags --batch 4 --seq 8 >"$tmp/base.json"; then
    fail "$name: run without clipping exit $?: $(tail -1 "$tmp/e")"
    continue
  fi
  # shellcheck disable=SC2086
  if ! run $SMALL $flags --batch 4 --seq 8 --max-norm $MAXN >"$tmp/clip.json"; then
    fail "$name: run exit $?: $(tail -1 "$tmp/e")"
    continue
  fi
  check "$name: status, clipping engaged, compared" "$(verdict "$tmp/clip.json")" "ok True True"
  # shellcheck disable=SC2086 # sets is a list
  check "$name: the norm's all_reduces" "$(extra "$tmp/base.json" "$tmp/clip.json")" \
    "$(derive "$pp" $sets)"
done <<'EOF'
tp-sp|--tp 2||tp
fsdp-tp|--plan fsdp-tp-sp --dp-shard 2 --tp 2||tp,dp_shard dp_shard
hsdp|--plan hsdp --dp-replicate 2 --dp-shard 2||dp_shard
fsdp-cp|--plan fsdp-cp --dp-shard 2 --cp 2||dp_shard,cp
pp-tp|--plan pp-tp-sp --pp 2 --tp 2|pp|tp
EOF

# f64: the norm against the reference at f64's tolerance (TP + SP)
# shellcheck disable=SC2086
if run $SMALL --tp 2 --batch 4 --seq 8 --dtype f64 --max-norm $MAXN >"$tmp/f64.json"; then
  check "tp-sp f64: status, clipping engaged, compared" "$(verdict "$tmp/f64.json")" "ok True True"
else
  fail "tp-sp f64: run exit $?: $(tail -1 "$tmp/e")"
fi

# 5-D: five-d.sh's config (32 ranks), f32, once with clipping
FIVE="--plan torchtitan-5d --pp 2 --dp-replicate 2 --dp-shard 2 --cp 2 --tp 2 --batch 8 --seq 16"
# shellcheck disable=SC2086
if run $FIVE --max-norm $MAXN >"$tmp/5d.json"; then
  check "5-D: status, clipping engaged, compared" "$(verdict "$tmp/5d.json")" "ok True True"
  # FSDP over dp_shard x cp, TP's weights on tp too; rank 0's ledger (pp rank 0)
  check "5-D: the norm's all_reduces" "$(python3 - "$tmp/5d.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(sorted((c["mesh_dim"], (c["calls"], c["payload_bytes"])) for c in d["comm"]
             if c["op"] == "all_reduce" and c["phase"] == "optimizer" and
             c["mesh_dim"] in ("pp", "dp_shard", "cp")))
PY
)" "$(derive pp dp_shard,cp,tp dp_shard,cp | python3 -c '
import ast, sys
print(sorted(kv for kv in ast.literal_eval(sys.stdin.read()) if kv[0] != "tp"))')"
else
  fail "5-D: run exit $?: $(tail -1 "$tmp/e")"
fi

# ---- it can fail ----
fault() { # NAME FAULT FLAGS...
  n=$1
  f=$2
  shift 2
  SHARDBENCH_FAULT=$f run "$@" --max-norm $MAXN >"$tmp/f.json"
  check "$n ($f): status, worst" "$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["status"], d["worst"])' "$tmp/f.json" 2>/dev/null)" "mismatch grad_norm step 0"
}
# shellcheck disable=SC2086
fault tp-sp norm-replicated:norm.weight $SMALL --tp 2 --batch 4 --seq 8
# shellcheck disable=SC2086
fault fsdp-tp norm-replicated:norm.weight $SMALL --plan fsdp-tp-sp --dp-shard 2 --tp 2 --batch 4 --seq 8
# shellcheck disable=SC2086
fault hsdp norm-replicated:norm.weight $SMALL --plan hsdp --dp-replicate 2 --dp-shard 2 --batch 4 --seq 8
# shellcheck disable=SC2086
fault pp-tp norm-replicated:norm.weight $SMALL --plan pp-tp-sp --pp 2 --tp 2 --batch 4 --seq 8
# shellcheck disable=SC2086
fault pp-tp norm-drop-stage:1 $SMALL --plan pp-tp-sp --pp 2 --tp 2 --batch 4 --seq 8
# shellcheck disable=SC2086
fault 5-D norm-drop-stage:1 $FIVE

# ---- gradient accumulation (--global-batch) ----
# The oracle: an accumulated step over 2 microsteps of 4 sequences computes the same
# gradient as one step over the 8 (equal microbatches: the mean of the rescaled means
# is the whole batch's mean; the same token rows), so its total norm (reported with a
# max_norm that never clips) equals the 8-sequence step's, f64, to the JSON's 9
# digits. Each run also verifies against its reference (which accumulates too), and
# the data-parallel reductions run once per microstep (gradient sync on, as
# TorchTitan's train_step leaves FSDP2 and replicate()): 2x the calls.
norm_of() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["status"], d["grad_norm"])' "$1"; }
calls() { python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(sum(c["calls"] for c in d["comm"] if c["phase"] == "backward" and c["op"] in ("all_reduce", "reduce_scatter") and c["mesh_dim"] != "tp"))' "$1"; }
while IFS='|' read -r name flags; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086
  if run $SMALL $flags --dtype f64 --batch 8 --seq 8 --max-norm 1e9 >"$tmp/big.json" &&
     run $SMALL $flags --dtype f64 --batch 4 --seq 8 --max-norm 1e9 >"$tmp/one.json" &&
     run $SMALL $flags --dtype f64 --batch 4 --global-batch 8 --seq 8 --max-norm 1e9 >"$tmp/acc.json"; then
    check "$name: accumulated 2 x 4 = one step of 8 (status, norm)" "$(norm_of "$tmp/acc.json")" \
      "$(norm_of "$tmp/big.json")"
    check "$name: reductions per microstep" "$(calls "$tmp/acc.json")" $(($(calls "$tmp/one.json") * 2))
  else
    fail "$name: accumulation run exit $?: $(tail -1 "$tmp/e")"
  fi
done <<'EOF2'
tp-sp|--tp 2
fsdp|--plan fsdp --dp-shard 2
hsdp|--plan hsdp --dp-replicate 2 --dp-shard 2
fsdp-tp|--plan fsdp-tp-sp --dp-shard 2 --tp 2
dp-cp|--plan dp-cp --dp-replicate 2 --cp 2
pp-ddp|--plan pp --pp 2 --dp-replicate 2
pp-fsdp|--plan pp-fsdp --pp 2 --dp-shard 2
EOF2
refused "--global-batch 6 --batch 4" "^shardbench run: --global-batch: 6 is not a multiple" \
  "$SB" run --plans-dir "$PLANS" --batch 4 --global-batch 6
refused "--global-batch with a block workload" "^shardbench run: --global-batch: " \
  "$SB" run --plans-dir "$PLANS" --workload block --batch 4 --global-batch 8

# ---- the lr schedule over 8 steps, with clipping (and accumulation) ----
# Consistency with the reference, which runs the same schedule, at every step's loss,
# gradients and norm; the schedule's own values are verify/test_lr_schedule's.
SCHED="--steps 8 --warmup 0 --lr-warmup-steps 2 --lr-decay-ratio 0.5 --lr-decay-type cosine --lr-min-factor 0.1 --max-norm $MAXN"
while IFS='|' read -r name flags; do
  [ -n "$name" ] || continue
  # shellcheck disable=SC2086
  if "$SB" run --plans-dir "$PLANS" --peak-tflops 1 --json $SMALL $flags $SCHED --seq 8 >"$tmp/s.json" 2>"$tmp/e"; then
    check "$name: 8 scheduled steps: status, clipping engaged, compared" "$(verdict "$tmp/s.json")" "ok True True"
  else
    fail "$name: scheduled run exit $?: $(tail -1 "$tmp/e")"
  fi
done <<'EOF2'
tp-sp|--tp 2 --batch 2 --global-batch 4
pp-fsdp|--plan pp-fsdp --pp 2 --dp-shard 2 --batch 4 --global-batch 8
fsdp|--plan fsdp --dp-shard 2 --batch 2 --global-batch 4
hsdp|--plan hsdp --dp-replicate 2 --dp-shard 2 --batch 4 --global-batch 8
fsdp-tp|--plan fsdp-tp-sp --dp-shard 2 --tp 2 --batch 2 --global-batch 4
cp|--plan fsdp-cp --dp-shard 2 --cp 2 --batch 2 --global-batch 4
pp-tp|--plan pp-tp-sp --pp 2 --tp 2 --batch 4
EOF2
for f in "--lr-decay-type exp" "--lr-decay-ratio 1.5" "--lr-min-factor -0.1" "--lr-warmup-steps -1"; do
  # shellcheck disable=SC2086
  refused "$f" "^shardbench run: ${f%% *}: " "$SB" run --plans-dir "$PLANS" $f
done

# ---- the plan setting, and bad values ----
sed 's/^loss_parallel = .*/&\nmax_norm = 0.01/' "$PLANS/torchtitan-tp-sp.plan" >"$tmp/tpclip.plan"
grep -q '^max_norm = 0.01$' "$tmp/tpclip.plan" || fail "could not add max_norm to the plan copy"
# shellcheck disable=SC2086
if run $SMALL --plan "$tmp/tpclip.plan" --tp 2 --batch 4 --seq 8 >"$tmp/p.json" &&
   run $SMALL --tp 2 --batch 4 --seq 8 --max-norm $MAXN >"$tmp/c.json"; then
  check "plan max_norm: the norm --max-norm gives" "$(python3 -c '
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
print(a["status"], a["grad_norm"] == b["grad_norm"], a["grad_norm"] is not None)' "$tmp/p.json" "$tmp/c.json")" "ok True True"
else
  fail "plan max_norm: run exit $?: $(tail -1 "$tmp/e")"
fi
for v in 0 -1 abc 1e999; do
  refused "--max-norm $v" "^shardbench run: --max-norm: " "$SB" run --plans-dir "$PLANS" --max-norm "$v"
done
sed 's/^max_norm = 0.01$/max_norm = 0/' "$tmp/tpclip.plan" >"$tmp/bad.plan"
line=$(grep -n '^max_norm' "$tmp/bad.plan" | cut -d: -f1)
refused "plan max_norm = 0" "bad.plan:$line:.*max_norm" "$SB" run --plan "$tmp/bad.plan" --tp 2

finish
