#!/bin/sh
# verify/ac.sh: activation checkpointing through `shardbench run` / `sweep` and plan
# files (the bitwise, ledger and exact-memory checks are verify/test_ac.c):
#   1. `run --ac MODE` on TP + SP (tp 2, debugmodel, f64, batch 2, seq 16) verifies
#      against the unsharded reference (which runs without AC) for none, full,
#      selective:2 and selective:op; the config key gains ac=MODE (none keeps the
#      old key); the DB's mem_activations_bytes is lower with each mode than
#      without, and full < op < selective:2 follows from what each keeps (full: a
#      block's input; op: 4 of its [b, s, dim] tensors, wv, w1; every 2nd block: half
#      the blocks keep everything); the recompute's tp rows: 4 collectives per
#      checkpointed block and microbatch in full mode (2 all_gather + 2
#      reduce_scatter, SequenceParallel's), 2 all_gathers in op mode.
#   2. a plan's activation_checkpoint_mode / selective_ac_option apply when --ac is
#      not given, and --ac overrides them (--ac none).
#   3. `sweep --ac none,full` runs each config once per setting, two keys.
#   4. it can fail: SHARDBENCH_FAULT=ac-zero:3 (each checkpointed block's 3rd recomputed
#      call left zero) is a mismatch against the reference under --ac full.
#   5. bad input: exit 2, one line, before any work: --ac partial, --ac selective:0,
#      --ac full:op; sweep --ac bogus; a plan with an unknown mode or N < 1 names
#      FILE:LINE.
NAME=ac
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

run() {
  "$SB" run --plans-dir "$PLANS" --tp 2 --dtype f64 --batch 2 --seq 16 --steps 1 --warmup 0 \
    --db "$tmp/db" --json "$@"
}
for ac in none full selective:2 selective:op; do
  if ! run --ac $ac >"$tmp/$ac.json" 2>"$tmp/e"; then
    fail "$ac: run exit $?: $(tail -1 "$tmp/e")"
    continue
  fi
  check "$ac: status, key" "$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["status"], d["compared"] > 0, d["key"].split("world=2")[1])' "$tmp/$ac.json")" \
    "ok True $([ $ac = none ] || echo " ac=$ac")"
done
check "recompute rows on tp (6 blocks, 1 microbatch)" "$(python3 - "$tmp" <<'PY'
import json, sys
out = []
for ac in ("none", "full", "selective:2", "selective:op"):
    d = json.load(open(f"{sys.argv[1]}/{ac}.json"))
    r = {c["op"]: c["calls"] for c in d["comm"] if c["phase"] == "recompute" and c["mesh_dim"] == "tp"}
    out.append(f"{ac}:{r.get('all_gather', 0)},{r.get('reduce_scatter', 0)}")
print(" ".join(out))
PY
)" "none:0,0 full:12,12 selective:2:6,6 selective:op:12,0"
# the DB's mem_activations_bytes by key
mem() { q "$tmp/db" "SELECT r.mem_activations_bytes FROM results r JOIN configs c ON c.id = r.config_id WHERE c.key LIKE '%world=2$1';"; }
m_none=$(mem "") m_full=$(mem " ac=full") m_sel=$(mem " ac=selective:2") m_op=$(mem " ac=selective:op")
check "mem_activations_bytes: full < op < selective:2 < none" \
  "$([ "$m_full" -lt "$m_op" ] && [ "$m_op" -lt "$m_sel" ] && [ "$m_sel" -lt "$m_none" ] && echo yes)" yes
echo "mem_activations_bytes: none $m_none, full $m_full, selective:op $m_op, selective:2 $m_sel"

# 2. the plan's setting, and --ac over it
sed 's/^loss_parallel = true$/loss_parallel = true\nactivation_checkpoint_mode = selective\nselective_ac_option = op/' \
  "$PLANS/torchtitan-tp-sp.plan" >"$tmp/acplan.plan"
grep -q '^selective_ac_option = op' "$tmp/acplan.plan" || fail "the test plan was not written"
key() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["status"], d["key"].split("world=2")[1])' "$1"; }
run --plan "$tmp/acplan.plan" >"$tmp/p.json" 2>"$tmp/e" || fail "plan setting: exit $?: $(tail -1 "$tmp/e")"
check "the plan's selective:op applies" "$(key "$tmp/p.json")" "ok  ac=selective:op"
run --plan "$tmp/acplan.plan" --ac none >"$tmp/p.json" 2>"$tmp/e" || fail "--ac none: exit $?"
check "--ac none overrides the plan" "$(key "$tmp/p.json")" "ok "

# 3. sweep --ac
"$SB" sweep --world 2 --plans-dir "$PLANS" --plans torchtitan-tp-sp --shapes tp:2 --workloads block \
  --dtypes f64 --batch 2 --seq 16 --steps 1 --warmup 0 --ac none,full --db "$tmp/s.db" \
  >"$tmp/o" 2>"$tmp/e" || fail "sweep --ac: exit $?: $(tail -1 "$tmp/e")"
check "sweep --ac none,full: two ok configs" \
  "$(q "$tmp/s.db" "SELECT count(*), sum(c.key LIKE '% ac=full') FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok';")" "2|1"

# 4. it can fail
SHARDBENCH_FAULT=ac-zero:3 run --ac full >"$tmp/f.json" 2>"$tmp/e"
rc=$?
check "fault ac-zero:3: exit 1, a mismatch" \
  "$rc $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$tmp/f.json")" "1 mismatch"

# 5. bad input
refused "--ac partial" "--ac" "$SB" run --plans-dir "$PLANS" --tp 2 --ac partial
refused "--ac selective:0" "--ac.*selective_ac_option '0'" "$SB" run --plans-dir "$PLANS" --tp 2 --ac selective:0
refused "--ac full:op" "--ac.*only selective" "$SB" run --plans-dir "$PLANS" --tp 2 --ac full:op
refused "sweep --ac bogus" "--ac" "$SB" sweep --world 2 --plans-dir "$PLANS" --ac none,bogus --db "$tmp/x.db"
printf 'name = x\ndims = tp:-1\nactivation_checkpoint_mode = sometimes\n' >"$tmp/bad1.plan"
refused "plan: unknown mode" "bad1.plan:3:.*'sometimes'" "$SB" run --plans-dir "$PLANS" --tp 2 --plan "$tmp/bad1.plan"
printf 'name = x\ndims = tp:-1\nactivation_checkpoint_mode = selective\nselective_ac_option = 0\n' >"$tmp/bad2.plan"
refused "plan: N < 1" "bad2.plan:4:.*selective_ac_option" "$SB" run --plans-dir "$PLANS" --tp 2 --plan "$tmp/bad2.plan"
[ ! -e "$tmp/x.db" ] || fail "sweep --ac bogus wrote a DB"
finish
