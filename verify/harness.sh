#!/bin/sh
# verify/harness.sh: `shardbench sweep` and its results DB end to end (make check).
#
# 1. A clean tiny sweep (world 4, all shipped plans, the block workload,
#    f32 and f64, batch 4, seq 8, 1 step) into a temporary DB, checked with the
#    sqlite3 CLI: counts per status, exactly one result per config, reasons on
#    skipped rows, positive step times on ok rows, tp comm rows for TP plans, no
#    mismatch or failure, finished runs; rank 0's memory split on ok rows, under
#    the measured peak, and FSDP's sharded weights under DP's whole ones.
# 2. The same sweep killed with SIGKILL once some rows exist (the DB is polled),
#    then --resume'd: the final (config, status) set equals the clean sweep's,
#    with no duplicate and no lost row.
# 3. Two concurrent sweeps on one new DB (disjoint --plans, together all shipped
#    plans): nothing lost.
# 4. Bad flags: exit 2, one line on stderr, nothing on stdout.
# 5. A file of random bytes and a DB of schema version 8 are refused (exit 2,
#    one line) and left byte-identical (cmp); version 1, 2 and 3 DBs are upgraded
#    in place, keeping their rows.
# Program: ${top_builddir:-.}/bench/shardbench; plans: ${srcdir:-.}/plans.
# Skips (77) when the sqlite3 CLI is missing (scripts/install-deps installs it).

NAME=harness.sh
. "$(dirname "$0")/harness-common.sh"
bgpid=
on_exit '[ -n "$bgpid" ] && kill -9 "$bgpid" 2>/dev/null'

# The tiny sweep: 15 mesh shapes x 19 plans x 1 workload (block) x 2 dtypes = 570 configs,
# 64 of which run, per dtype: tp:4 and dp_replicate:2,tp:2 for the 3 TP plans,
# dp_replicate:4 for dp, dp_shard:4 and dp_replicate:2,dp_shard:2 for fsdp, fsdp-bf16,
# zero2 and zero1, dp_replicate:2,dp_shard:2 for hsdp (dp_shard fixed at 2),
# dp_shard:2,tp:2 for fsdp-tp-sp (tp fixed at 2); fsdp-cp on cp:4, dp_replicate:2,cp:2,
# dp_shard:2,cp:2, dp_shard:4 and dp_replicate:2,dp_shard:2; dp-cp on dp_replicate:4, cp:4
# and dp_replicate:2,cp:2; fsdp-tp-cp on dp_shard:2,tp:2 and cp:2,tp:2; pp on
# pp:2,dp_replicate:2 (pp:4 cannot split a 1-layer block into 4 stages), pp-tp-sp on
# pp:2,tp:2, pp-fsdp on pp:2,dp_shard:2 and pp-fsdp-cp on pp:2,dp_shard:2 and pp:2,cp:2
# (pp-fsdp-tp-sp and torchtitan-5d need 8 ranks or more); the model workload (6 layers)
# runs in the README sweep.
TINY="--world 4 --plans-dir $PLANS --plans all --workloads block --dtypes f32,f64 --batch 4 --seq 8 --steps 1 --warmup 0"
TOTAL=570
RUNS=64

# ---- 1. clean sweep -----------------------------------------------------------------
A="$tmp/clean.db"
t0=$(date +%s)
# shellcheck disable=SC2086
"$SB" sweep $TINY --db "$A" >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?
echo "clean sweep: $(( $(date +%s) - t0 )) s: $(cat "$tmp/a.out")"
check "clean sweep exit" "$rc" 0
check "schema_version" "$(q "$A" 'SELECT group_concat(version) FROM schema_version')" 7
check "configs" "$(q "$A" 'SELECT count(*) FROM configs')" $TOTAL
check "results" "$(q "$A" 'SELECT count(*) FROM results')" $TOTAL
check "one result per config" \
  "$(q "$A" 'SELECT count(*) FROM (SELECT config_id FROM results GROUP BY config_id HAVING count(*) != 1)')" 0
check "ok rows" "$(q "$A" "SELECT count(*) FROM results WHERE status = 'ok'")" $RUNS
check "skipped rows" "$(q "$A" "SELECT count(*) FROM results WHERE status = 'skipped'")" $((TOTAL - RUNS))
check "mismatch/failed rows" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status IN ('mismatch', 'failed')")" 0
check "skipped rows have reasons" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'skipped' AND (reason IS NULL OR reason = '')")" 0
check "ok rows have step times, tolerances and memory" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'ok' AND NOT (step_time_s > 0 AND tokens_per_s > 0 AND tflops > 0 AND mfu > 0 AND peak_mem_bytes > 0 AND max_rel_err <= tolerance)")" 0
# Rank 0's memory split (results.mem_*_bytes): the persistent state measured from the
# tensors and the activations (the forward's peak above the state, lib/parallel
# trainer.h dt_trainer_step); peak_mem_bytes is the allocator's high-water
# mark, max over ranks and over the whole run, an independent count that bounds it.
check "ok rows have the memory split, each part > 0 but the activations >= 0" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'ok' AND NOT (mem_params_bytes > 0 AND mem_grads_bytes > 0 AND mem_optimizer_bytes > 0 AND mem_activations_bytes >= 0)")" 0
# the activations are the forward's peak, before the step's gradients exist (backward
# frees activations as it makes gradients; AdamW makes its states after the first
# step's backward): the weights and they fit in the peak, and so does the whole state
# (the optimizer step holds it)
check "ok rows: params + activations <= peak_mem_bytes" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'ok' AND NOT (mem_params_bytes + mem_activations_bytes <= peak_mem_bytes)")" 0
check "ok rows: params + grads + optimizer <= peak_mem_bytes" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'ok' AND NOT (mem_params_bytes + mem_grads_bytes + mem_optimizer_bytes <= peak_mem_bytes)")" 0
check "skipped rows have no memory split" \
  "$(q "$A" "SELECT count(*) FROM results WHERE status = 'skipped' AND coalesce(mem_params_bytes, mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes) IS NOT NULL")" 0
# FSDP keeps 1/dp_shard of the weights per rank, DP all of them: every ok fsdp row
# (dp_shard:4 and dp_replicate:2,dp_shard:2, f32 and f64) against the ok dp row of
# its workload and dtype (dp_replicate:4). The count of pairs makes a missing dp row
# or split fail instead of passing by vanishing.
FSDP_PAIRS="FROM results f JOIN configs fc ON fc.id = f.config_id JOIN configs dc ON dc.workload = fc.workload AND dc.model = fc.model AND dc.dtype = fc.dtype AND dc.batch = fc.batch AND dc.seq = fc.seq AND dc.plan = 'dp' JOIN results d ON d.config_id = dc.id AND d.status = 'ok' WHERE f.status = 'ok' AND fc.plan = 'fsdp' AND fc.dp_shard > 1"
check "fsdp rows paired with a dp row" "$(q "$A" "SELECT count(*) $FSDP_PAIRS")" 4
check "fsdp rows: params < the dp row's params" \
  "$(q "$A" "SELECT count(*) $FSDP_PAIRS AND NOT (f.mem_params_bytes < d.mem_params_bytes)")" 0
check "TP ok rows have tp comm rows" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.tp > 1 AND NOT EXISTS (SELECT 1 FROM comm m WHERE m.result_id = r.id AND m.mesh_dim = 'tp' AND m.calls > 0 AND m.wire_bytes > 0)")" 0
check "dp ok rows have dp_replicate all_reduce rows" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.dp_replicate > 1 AND NOT EXISTS (SELECT 1 FROM comm m WHERE m.result_id = r.id AND m.mesh_dim LIKE 'dp_replicate%' AND m.op = 'all_reduce')")" 0
# Framework baselines: every ok config with a tp or dp_replicate dim has the one cross its
# plan's settings select (comm_bytes_per_step_combined: Megatron-LM TP / TP + SP from the
# papers' formulas, plus DDP), named after the parts.
check "TP configs have a Megatron-LM framework cross" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.tp > 1 AND (SELECT count(*) FROM baselines b WHERE b.config_id = c.id AND b.quantity = 'comm_bytes_per_step_combined' AND b.framework LIKE 'megatron-tp%') != 1")" 0
check "dp_replicate configs have a ddp part in their cross" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.dp_replicate > 1 AND c.dp_shard = 1 AND c.cp = 1 AND NOT EXISTS (SELECT 1 FROM baselines b WHERE b.config_id = c.id AND b.quantity = 'comm_bytes_per_step_combined' AND (b.framework LIKE '%ddp' OR b.framework LIKE '%ddp+pp-p2p'))")" 0
check "cp configs have a ring or all-gather attention part in their cross" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.cp > 1 AND NOT EXISTS (SELECT 1 FROM baselines b WHERE b.config_id = c.id AND b.quantity = 'comm_bytes_per_step_combined' AND (b.framework LIKE '%+ring-cp%' OR b.framework LIKE '%+allgather-cp%'))")" 0
check "cp ok rows" "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.cp > 1")" 14
check "dp_shard configs have an fsdp (hsdp with dp_replicate, zero1, zero2) part in their cross" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.dp_shard > 1 AND NOT EXISTS (SELECT 1 FROM baselines b WHERE b.config_id = c.id AND b.quantity = 'comm_bytes_per_step_combined' AND (b.framework LIKE (CASE WHEN c.dp_replicate > 1 THEN '%hsdp%' ELSE '%fsdp%' END) OR b.framework LIKE '%zero1' OR b.framework LIKE '%zero2'))")" 0
# REGRESSION check (not an independent oracle): the measured comm bytes per step of every
# ok config equal the runtime's own closed form stored next to them (framework
# 'runtime-model'; bench/harness/baselines_model.c sb_runtime_comm_compute), ratio 1.00
# within 1e-12: both sum exact binary fractions of the same sizes. Written with
# NOT ... <= so that a NULL (a config without comm rows: coalesce gives 0) never
# passes by vanishing from the comparison; 0 = 0 is a match.
# (the closed form does not cover pipeline parallel yet: pp configs have no row)
check "REGRESSION: ok configs have a runtime-model row" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.pp = 1 AND NOT EXISTS (SELECT 1 FROM baselines b WHERE b.config_id = r.config_id AND b.framework = 'runtime-model')")" 0
check "pp ok rows, with pp send rows" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.pp > 1 AND EXISTS (SELECT 1 FROM comm m WHERE m.result_id = r.id AND m.mesh_dim = 'pp' AND m.op = 'send' AND m.calls > 0)")" 10
check "REGRESSION: measured / runtime-model comm = 1.00" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN baselines b ON b.config_id = r.config_id WHERE r.status = 'ok' AND b.framework = 'runtime-model' AND NOT abs(coalesce((SELECT sum(wire_bytes) FROM comm m WHERE m.result_id = r.id), 0) - b.value) <= 1e-12 * b.value")" 0
check "run finished" "$(q "$A" 'SELECT count(*) FROM runs WHERE finished IS NOT NULL')" 1
check "pp configs: ok, or skipped for a plan without pp, a split that does not fit or a dim the plan needs" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE c.pp > 1 AND r.status != 'ok' AND NOT (r.status = 'skipped' AND (r.reason LIKE 'plan %' OR r.reason LIKE 'pipeline: %' OR r.reason LIKE 'tp=1:%' OR r.reason LIKE 'dp_shard=1, cp=1:%'))")" 0
check "pp ok configs: their pipeline sends equal the pp-p2p cross" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id JOIN baselines b ON b.config_id = c.id AND b.framework = 'pp-p2p' WHERE r.status = 'ok' AND c.pp > 1 AND abs((SELECT sum(wire_bytes) FROM comm m WHERE m.result_id = r.id AND m.mesh_dim = 'pp') - b.value) <= 1e-9 * b.value")" 10
# the timeline comes back from the sweep's child (bench/harness/sweep.c): pp_stats and
# events for each pp ok result, none for the others (verify/pp-timeline.sh checks the rows)
check "pp ok configs: a pp_stats row, pp_stages rows and events each; no other result has them" \
  "$(q "$A" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id JOIN pp_stats p ON p.result_id = r.id WHERE r.status = 'ok' AND c.pp > 1 AND p.pp = c.pp AND (SELECT count(*) FROM pp_stages g WHERE g.result_id = r.id) = c.pp AND EXISTS (SELECT 1 FROM pp_events e WHERE e.result_id = r.id)") $(q "$A" "SELECT count(*) FROM pp_stats") $(q "$A" "SELECT count(DISTINCT result_id) FROM pp_events")" \
  "10 10 10"
q "$A" "SELECT c.key || ' ' || r.status FROM results r JOIN configs c ON c.id = r.config_id ORDER BY 1" >"$tmp/a.set"

# ---- 2. SIGKILL mid-sweep, then --resume ----------------------------------------------
B="$tmp/killed.db"
# shellcheck disable=SC2086
"$SB" sweep $TINY --db "$B" >/dev/null 2>"$tmp/b.err" &
bgpid=$!
# Kill once a run has finished (ok rows exist) but before the end; 0.1 s polls, 60 s cap.
n=0
i=0
while [ $i -lt 600 ]; do
  n=$(q "$B" "SELECT count(*) FROM results WHERE status = 'ok'" 2>/dev/null || echo 0)
  [ "${n:-0}" -ge 3 ] && break
  kill -0 $bgpid 2>/dev/null || break
  sleep 0.1
  i=$((i + 1))
done
kill -9 $bgpid 2>/dev/null
killed=$?
wait $bgpid 2>/dev/null
bgpid=
before=$(q "$B" 'SELECT count(*) FROM results')
echo "killed sweep: kill -9 after $before result rows ($n ok); kill status $killed"
checks=$((checks + 1))
if [ "$killed" -ne 0 ] || [ "$before" -ge $TOTAL ]; then
  fail "the sweep was not killed mid-run ($before rows)"
fi
check "killed run not finished" "$(q "$B" 'SELECT count(*) FROM runs WHERE finished IS NULL')" 1
check "no half rows: every result has its config" \
  "$(q "$B" 'SELECT count(*) FROM results WHERE config_id NOT IN (SELECT id FROM configs)')" 0
# shellcheck disable=SC2086
"$SB" sweep $TINY --db "$B" --resume >"$tmp/b.out" 2>"$tmp/b2.err"
check "resumed sweep exit" "$?" 0
echo "resumed: $(cat "$tmp/b.out")"
check "resumed: results" "$(q "$B" 'SELECT count(*) FROM results')" $TOTAL
check "resumed: one result per config" \
  "$(q "$B" 'SELECT count(*) FROM (SELECT config_id FROM results GROUP BY config_id HAVING count(*) != 1)')" 0
check "resumed: rows before the kill kept" \
  "$(grep -c "already in the DB" "$tmp/b.out") $(sed -n 's/.* \([0-9]*\) already in the DB.*/\1/p' "$tmp/b.out")" "1 $before"
q "$B" "SELECT c.key || ' ' || r.status FROM results r JOIN configs c ON c.id = r.config_id ORDER BY 1" >"$tmp/b.set"
checks=$((checks + 1))
cmp -s "$tmp/a.set" "$tmp/b.set" || { fail "killed + resumed (config, status) set differs from the clean sweep's"; diff "$tmp/a.set" "$tmp/b.set" | head -5; }

# ---- 3. two concurrent sweeps on one DB ---------------------------------------------
C="$tmp/concurrent.db"
SMALL="--world 4 --plans-dir $PLANS --workloads block --dtypes f32,f64 --batch 4 --seq 8 --steps 1 --warmup 0"
# shellcheck disable=SC2086
"$SB" sweep $SMALL --plans torchtitan-tp-sp,tp-no-loss-parallel,fsdp,hsdp,fsdp-tp-sp,fsdp-bf16,fsdp-cp,pp,pp-fsdp --db "$C" >/dev/null 2>"$tmp/c1.err" &
p1=$!
# shellcheck disable=SC2086
"$SB" sweep $SMALL --plans dp,megatron-tp,zero1,zero2,dp-cp,fsdp-tp-cp,pp-tp-sp,pp-fsdp-tp-sp,pp-fsdp-cp,torchtitan-5d --db "$C" >/dev/null 2>"$tmp/c2.err"
rc2=$?
wait $p1
rc1=$?
check "concurrent sweeps exit" "$rc1 $rc2" "0 0"
check "concurrent: results" "$(q "$C" 'SELECT count(*) FROM results')" $TOTAL
check "concurrent: one result per config" \
  "$(q "$C" 'SELECT count(*) FROM (SELECT config_id FROM results GROUP BY config_id HAVING count(*) != 1)')" 0
check "concurrent: runs finished" "$(q "$C" 'SELECT count(*) FROM runs WHERE finished IS NOT NULL')" 2
check "concurrent: one schema_version row" "$(q "$C" 'SELECT count(*) FROM schema_version')" 1
q "$C" "SELECT c.key || ' ' || r.status FROM results r JOIN configs c ON c.id = r.config_id ORDER BY 1" >"$tmp/c.set"
checks=$((checks + 1))
cmp -s "$tmp/a.set" "$tmp/c.set" || fail "concurrent (config, status) set differs from the clean sweep's"

# --shapes: only the shapes given, each x plans x workloads x dtypes
D="$tmp/shapes.db"
"$SB" sweep --world 4 --plans-dir "$PLANS" --plans dp-cp,fsdp-cp --workloads block --dtypes f32 \
  --batch 4 --seq 8 --steps 1 --warmup 0 --shapes cp:4/dp_replicate:2,cp:2 --db "$D" >/dev/null 2>"$tmp/s.err"
check "--shapes: configs, ok" "$(q "$D" "SELECT count(*), sum(r.status = 'ok') FROM results r")" "4|4"
check "--shapes: the shapes" "$(q "$D" "SELECT group_concat(DISTINCT dp_replicate || 'x' || cp) FROM (SELECT * FROM configs ORDER BY cp)")" "2x2,1x4"

# ---- 4. bad flags ---------------------------------------------------------------------
bad() { # bad NAME ARGS...: shardbench ARGS is bad input
  n=$1
  shift
  refused "$n" '' "$SB" "$@"
}
bad "sweep unknown flag" sweep --bogus
bad "sweep world 0" sweep --world 0 --db "$tmp/x.db"
bad "sweep no world" sweep --db "$tmp/x.db"
bad "sweep bad plan" sweep --world 2 --plans nosuch --plans-dir "$PLANS" --db "$tmp/x.db"
bad "sweep bad dtype" sweep --world 2 --dtypes f16 --db "$tmp/x.db"
bad "sweep bad workload" sweep --world 2 --workloads blocks --db "$tmp/x.db"
bad "sweep bad backend" sweep --world 2 --backend carrier-pigeon --db "$tmp/x.db"
bad "sweep missing value" sweep --world
bad "sweep shape not the world" sweep --world 8 --shapes cp:4 --db "$tmp/x.db"
bad "sweep shape twice" sweep --world 8 --shapes cp:8/cp:8 --db "$tmp/x.db"
bad "sweep shape empty" sweep --world 8 --shapes cp:8/ --db "$tmp/x.db"
bad "sweep shape bad dim" sweep --world 8 --shapes cq:8 --db "$tmp/x.db"
bad "run bad mesh" run --mesh tp:4,dp_replicate:2 --plans-dir "$PLANS"
bad "run mesh and dims" run --mesh tp:2 --tp 2 --plans-dir "$PLANS"
bad "run world mismatch" run --tp 4 --world 2 --plans-dir "$PLANS"
bad "run bad steps" run --steps -1 --plans-dir "$PLANS"
bad "run no plan file" run --plan nosuch --plans-dir "$PLANS"
bad "run bad model" run --model 7B --plans-dir "$PLANS"
bad "run json with value" run --json=1
checks=$((checks + 1))
[ -e "$tmp/x.db" ] && fail "a refused command created its DB"

# ---- 5. refused DB files, left untouched --------------------------------------------
refused_db() { # refused_db NAME FILE PATTERN
  cp "$2" "$2.orig"
  "$SB" sweep --world 2 --plans-dir "$PLANS" --plans dp --workloads block --db "$2" >"$tmp/o" 2>"$tmp/e"
  rc=$?
  checks=$((checks + 1))
  if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/e")" -ne 1 ] || ! grep -q "$3" "$tmp/e"; then
    fail "$1: exit $rc, stderr: $(cat "$tmp/e")"
  fi
  checks=$((checks + 1))
  cmp -s "$2" "$2.orig" || fail "$1: the file was modified"
  checks=$((checks + 1))
  [ -e "$2-wal" ] && fail "$1: a WAL file was created"
  "$SB" run --tp 2 --plans-dir "$PLANS" --workload block --batch 2 --seq 4 --steps 1 --db "$2" >/dev/null 2>"$tmp/e"
  rc=$?
  checks=$((checks + 1))
  { [ $rc -eq 2 ] && cmp -s "$2" "$2.orig"; } || fail "$1 (run --db): exit $rc or the file was modified"
}
head -c 8192 /dev/urandom >"$tmp/random.db"
refused_db "random bytes" "$tmp/random.db" "not a SQLite database"
sqlite3 "$tmp/v8.db" "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (8);"
refused_db "schema version 8" "$tmp/v8.db" "schema version 8, this shardbench reads 1 to 7"

# ---- version 1 to 3 DBs (version 7 less what was added since) are upgraded in place ------
# the split's columns and the ones version 2 added, in results/schema.sql's order
cols() { q "$1" "SELECT group_concat(name, ' ') FROM pragma_table_info('results') WHERE cid >= 15"; }
NEWCOLS="worst mem_params_bytes mem_grads_bytes mem_optimizer_bytes mem_activations_bytes grad_norm"
V1="$tmp/v1.db"
make_v1_db "$A" "$V1"
"$SB" run --tp 2 --world 2 --plans-dir "$PLANS" --workload block --batch 2 --seq 4 --steps 1 --warmup 0 --db "$V1" >/dev/null 2>&1
check "v1 upgraded: run exit" "$?" 0
check "v1 upgraded: version" "$(q "$V1" 'SELECT group_concat(version) FROM schema_version')" 7
check "v1 upgraded: old rows kept, one added" "$(q "$V1" 'SELECT count(*) FROM results')" $((TOTAL + 1))
check "v1 upgraded: new columns" "$(cols "$V1")" "$NEWCOLS"
check "v1 upgraded: the added row has its split" \
  "$(q "$V1" "SELECT count(*) FROM results WHERE id = (SELECT max(id) FROM results) AND mem_params_bytes > 0")" 1
# A version 2 DB with two ok results taken out (and their comm rows), resumed: the
# upgrade keeps every row (the old ones with a NULL split) and the resume runs the two.
V2="$tmp/v2.db"
make_v2_db "$A" "$V2"
GONE="SELECT r.id FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.plan = 'fsdp' AND c.dp_shard = 4"
q "$V2" "DELETE FROM comm WHERE result_id IN ($GONE); DELETE FROM results WHERE id IN ($GONE);"
check "v2 DB: version 2, two results out" \
  "$(q "$V2" 'SELECT version FROM schema_version') $(q "$V2" 'SELECT count(*) FROM results') $(cols "$V2")" \
  "2 $((TOTAL - 2)) worst"
# shellcheck disable=SC2086
"$SB" sweep $TINY --db "$V2" --resume >"$tmp/v2.out" 2>"$tmp/v2.err"
check "v2 upgraded by sweep --resume: exit" "$?" 0
check "v2 upgraded: version" "$(q "$V2" 'SELECT group_concat(version) FROM schema_version')" 7
check "v2 upgraded: new columns" "$(cols "$V2")" "$NEWCOLS"
check "v2 upgraded: old rows kept, the two run" "$(q "$V2" 'SELECT count(*) FROM results')" $TOTAL
check "v2 upgraded: old rows without a split, the two with it" \
  "$(q "$V2" "SELECT count(*) FROM results WHERE mem_params_bytes IS NULL") $(q "$V2" "SELECT count(*) FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' AND c.plan = 'fsdp' AND c.dp_shard = 4 AND r.mem_params_bytes > 0")" \
  "$((TOTAL - 2)) 2"
q "$V2" "SELECT c.key || ' ' || r.status FROM results r JOIN configs c ON c.id = r.config_id ORDER BY 1" >"$tmp/v2.set"
checks=$((checks + 1))
cmp -s "$tmp/a.set" "$tmp/v2.set" || fail "v2 upgraded: (config, status) set differs from the clean sweep's"

# A version 3 DB (no pp tables): a pp run upgrades it and writes its timeline.
V3="$tmp/v3.db"
make_v3_db "$A" "$V3"
"$SB" run --pp 2 --world 2 --plan pp --plans-dir "$PLANS" --workload block --batch 2 --seq 4 --steps 1 --warmup 0 --db "$V3" >/dev/null 2>&1
check "v3 upgraded by a pp run: exit" "$?" 0
check "v3 upgraded: version, results, the new result's pp_stats row" \
  "$(q "$V3" 'SELECT group_concat(version) FROM schema_version') $(q "$V3" 'SELECT count(*) FROM results') $(q "$V3" 'SELECT count(*) FROM pp_stats WHERE result_id = (SELECT max(id) FROM results)')" \
  "7 $((TOTAL + 1)) 1"

# ---- run --db appends to an existing DB ------------------------------------------------
"$SB" run --tp 2 --world 2 --plans-dir "$PLANS" --workload block --batch 2 --seq 4 --steps 1 --warmup 0 --db "$A" >/dev/null 2>&1
check "run --db exit" "$?" 0
check "run --db appended a result" "$(q "$A" 'SELECT count(*) FROM results')" $((TOTAL + 1))

finish
