#!/bin/sh
# verify/sweep-split.sh: a sweep split, merged, killed and resumed, and looked at
# (threads backend; verify/mpi-sweep.sh does the same checks' MPI part):
#   1. `sweep --shard I/3` for I = 1, 2, 3, merged with `shardbench merge`, equals
#      the unsplit sweep row for row: configs, each key's status and reason, comm
#      rows (op, mesh dim, phase, calls, bytes), the pipelined config's pp_events
#      (step, rank, action, stage, microbatch), pp_stats and pp_stages counts.
#      Oracle: the unsplit sweep's own DB (no shard, no merge); times are left out
#      (measured, so they differ run to run). Each merged result keeps its run: the
#      three shards' runs, each the one whose argv names its --shard.
#   2. kill -9 of the sweep while a config runs (a planted hang holds it there),
#      then --resume: the same rows as the unsplit sweep, one result per config
#      (none lost, none twice), and no process of the killed sweep is left.
#   3. `status` on the killed DB: its counts equal sqlite3's own count of configs
#      with and without a result row; the killed run is listed as not finished.
#   4. merge and status refuse a foreign SQLite DB, an empty file, a directory, a
#      text file and schema versions 3 and 5 with exit 2 and one line, and leave
#      each byte for byte as it was (and create no OUT).
#   5. It can fail: the comparison of 1 sees a merge of two shards only, and a
#      resumed DB with one result deleted.
NAME=sweep-split
. "$(dirname "$0")/harness-common.sh"
unset SHARDBENCH_FAULT

SW="--world 2 --plans-dir $PLANS --plans dp,fsdp,pp --workloads block --dtypes f32 --batch 2 --seq 8 --steps 1 --warmup 0"
# dump DB: the rows that must agree between two sweeps of the same list.
dump() {
  q "$1" "SELECT 'config', key FROM configs ORDER BY key;
    SELECT 'result', c.key, r.status, coalesce(r.reason, '') FROM results r
      JOIN configs c ON c.id = r.config_id ORDER BY c.key, r.id;
    SELECT 'comm', c.key, m.op, m.mesh_dim, m.phase, m.calls, m.payload_bytes, m.wire_bytes
      FROM comm m JOIN results r ON r.id = m.result_id JOIN configs c ON c.id = r.config_id
      ORDER BY 2, 3, 4, 5, 6, 7, 8;
    SELECT 'pp_event', c.key, e.step, e.rank, e.pp_rank, e.action, e.stage, e.microbatch
      FROM pp_events e JOIN results r ON r.id = e.result_id JOIN configs c ON c.id = r.config_id
      ORDER BY 2, 3, 4, 5, 6, 7, 8;
    SELECT 'pp_stats', c.key, s.schedule, s.pp, s.virtual_stages, s.microbatches, s.steps
      FROM pp_stats s JOIN results r ON r.id = s.result_id JOIN configs c ON c.id = r.config_id
      ORDER BY 2;
    SELECT 'pp_stage', c.key, g.pp_rank, g.max_in_flight
      FROM pp_stages g JOIN results r ON r.id = g.result_id JOIN configs c ON c.id = r.config_id
      ORDER BY 2, 3;"
}

# ---- 1. three shards merged = the unsplit sweep ---------------------------------------
# shellcheck disable=SC2086
"$SB" sweep $SW --db "$tmp/all.db" >/dev/null 2>"$tmp/e"
check "unsplit sweep: exit" "$?" 0
dump "$tmp/all.db" >"$tmp/all.txt"
check "unsplit sweep: a pipelined timeline to compare" \
  "$(grep -c '^pp_event' "$tmp/all.txt" | sed 's/^0$/none/;s/^[1-9][0-9]*$/some/')" some
for i in 1 2 3; do
  # shellcheck disable=SC2086
  "$SB" sweep $SW --shard "$i/3" --db "$tmp/s$i.db" >/dev/null 2>"$tmp/e"
  check "shard $i/3: exit" "$?" 0
done
n1=$(q "$tmp/s1.db" "SELECT count(*) FROM configs")
n2=$(q "$tmp/s2.db" "SELECT count(*) FROM configs")
n3=$(q "$tmp/s3.db" "SELECT count(*) FROM configs")
check "shards: disjoint parts of the whole" "$((n1 + n2 + n3))" "$(q "$tmp/all.db" "SELECT count(*) FROM configs")"
"$SB" merge "$tmp/m.db" "$tmp/s1.db" "$tmp/s2.db" "$tmp/s3.db" >/dev/null 2>"$tmp/e"
check "merge: exit" "$?" 0
dump "$tmp/m.db" >"$tmp/m.txt"
checks=$((checks + 1))
cmp -s "$tmp/all.txt" "$tmp/m.txt" || fail "merged shards differ from the unsplit sweep: $(diff "$tmp/all.txt" "$tmp/m.txt" | head -5)"
check "merge: each result's run is its shard's" \
  "$(q "$tmp/m.db" "SELECT count(DISTINCT u.id) || ' ' || sum(instr(u.argv, '--shard') > 0) || ' ' || count(*) FROM results r JOIN runs u ON u.id = r.run_id")" \
  "3 $(q "$tmp/all.db" "SELECT count(*) FROM results") $(q "$tmp/all.db" "SELECT count(*) FROM results")"
# merging an input again changes nothing (the rule keeps the row already there)
"$SB" merge "$tmp/m.db" "$tmp/s2.db" >/dev/null 2>&1
dump "$tmp/m.db" >"$tmp/m2.txt"
checks=$((checks + 1))
cmp -s "$tmp/m.txt" "$tmp/m2.txt" || fail "merging a shard twice changed the DB"
# the rule: a verdict beats failed, whatever the order
cp "$tmp/s1.db" "$tmp/f1.db"
q "$tmp/f1.db" "UPDATE results SET status = 'failed', reason = 'planted', created = '2999-01-01T00:00:00Z' WHERE id = (SELECT min(id) FROM results WHERE status = 'ok')"
"$SB" merge "$tmp/r1.db" "$tmp/f1.db" "$tmp/s1.db" >/dev/null 2>&1
"$SB" merge "$tmp/r2.db" "$tmp/s1.db" "$tmp/f1.db" >/dev/null 2>&1
check "merge rule: ok beats a later failed, in either order" \
  "$(q "$tmp/r1.db" "SELECT count(*) FROM results WHERE status = 'failed'") $(q "$tmp/r2.db" "SELECT count(*) FROM results WHERE status = 'failed'")" "0 0"

# ---- 5. the comparison can fail -------------------------------------------------------
"$SB" merge "$tmp/m12.db" "$tmp/s1.db" "$tmp/s2.db" >/dev/null 2>&1
dump "$tmp/m12.db" >"$tmp/m12.txt"
checks=$((checks + 1))
cmp -s "$tmp/all.txt" "$tmp/m12.txt" && fail "planted: two shards of three compared equal"

# ---- 2. kill -9 mid-sweep, then --resume ----------------------------------------------
# The dp config on dp_replicate:2 hangs (a planted hang, rank 0 of its child):
# the sweep waits there, its earlier configs written, until it is killed.
total=$(q "$tmp/all.db" "SELECT count(*) FROM configs")
# TMPDIR: the killed sweep's scratch directory goes with $tmp
# shellcheck disable=SC2086
SHARDBENCH_FAULT='hang:0@plan=dp mesh=dp_replicate:2' TMPDIR="$tmp" "$SB" sweep $SW --config-timeout 120 \
  --db "$tmp/k.db" >/dev/null 2>"$tmp/k.err" &
pid=$!
n=0
i=0
while [ $i -lt 300 ]; do # 30 s at most
  n=$(q "$tmp/k.db" "SELECT count(*) FROM results" 2>/dev/null || echo 0)
  [ "${n:-0}" -ge 9 ] && break # the 9 configs before the hung one (list order: shape, then plan)
  sleep 0.1
  i=$((i + 1))
done
sleep 0.5 # in the hung config now: nothing more gets written
kill -9 "$pid"
wait "$pid" 2>/dev/null
sleep 1 # PR_SET_PDEATHSIG: the child goes with it
n=$(q "$tmp/k.db" "SELECT count(*) FROM results")
checks=$((checks + 1))
if [ "$n" -lt 1 ] || [ "$n" -ge "$total" ]; then fail "kill -9: $n of $total results before the kill, expected a part"; fi
check "kill -9: the killed sweep's scratch directory is under \$tmp" \
  "$(find "$tmp" -maxdepth 1 -name 'shardbench-sweep-*' | wc -l | tr -d ' ')" 1
check "kill -9: no process of the killed sweep left" \
  "$(ps -eo args | awk -v p="$tmp/k.db" 'index($0, p) && !/awk/' | wc -l | tr -d ' ')" 0

# ---- 3. status on the killed DB -------------------------------------------------------
"$SB" status --db "$tmp/k.db" --json >"$tmp/st.json" 2>"$tmp/e"
check "status: exit" "$?" 0
want_left=$(q "$tmp/k.db" "SELECT count(*) FROM configs WHERE id NOT IN (SELECT config_id FROM results)")
want_done=$(q "$tmp/k.db" "SELECT count(DISTINCT config_id) FROM results")
check "status: done and remaining" \
  "$(sed 's/.*"configs": \([0-9]*\), "done": \([0-9]*\),.*"remaining": \([0-9]*\),.*/\1 \2 \3/' "$tmp/st.json")" \
  "$total $want_done $want_left"
check "status: the killed run not finished" \
  "$(sed 's/.*"unfinished_runs": \[\([0-9, ]*\)\].*/\1/' "$tmp/st.json")" \
  "$(q "$tmp/k.db" "SELECT group_concat(id, ', ') FROM runs WHERE finished IS NULL")"
"$SB" status --db "$tmp/k.db" >"$tmp/st.txt" 2>&1
checks=$((checks + 1))
if ! grep -q "$want_left remaining" "$tmp/st.txt" || ! grep -q "not finished" "$tmp/st.txt"; then
  fail "status text: $(head -3 "$tmp/st.txt")"
fi

# shellcheck disable=SC2086
"$SB" sweep $SW --resume --db "$tmp/k.db" >/dev/null 2>"$tmp/e"
check "resume: exit" "$?" 0
dump "$tmp/k.db" >"$tmp/k.txt"
checks=$((checks + 1))
cmp -s "$tmp/all.txt" "$tmp/k.txt" || fail "killed + resumed differs from the unsplit sweep: $(diff "$tmp/all.txt" "$tmp/k.txt" | head -5)"
check "resume: one result per config" \
  "$(q "$tmp/k.db" "SELECT count(*) || ' ' || count(DISTINCT config_id) FROM results")" "$total $total"
# planted: one result gone is seen
cp "$tmp/k.db" "$tmp/k1.db"
q "$tmp/k1.db" "PRAGMA foreign_keys = ON; DELETE FROM results WHERE id = (SELECT max(id) FROM results)"
dump "$tmp/k1.db" >"$tmp/k1.txt"
checks=$((checks + 1))
cmp -s "$tmp/all.txt" "$tmp/k1.txt" && fail "planted: a lost result compared equal"

# ---- 4. refusals ----------------------------------------------------------------------
q "$tmp/foreign.db" "CREATE TABLE t(x); INSERT INTO t VALUES (1);"
: >"$tmp/empty.db"
mkdir "$tmp/dir.db"
echo "not a DB" >"$tmp/text.db"
make_v3_db "$tmp/s1.db" "$tmp/v3.db"
# one version past results/schema.sql's (its schema_version comment): a newer program's DB
next=$(($(sed -n 's/^  version INTEGER NOT NULL *-- *\([0-9]*\).*/\1/p' "${srcdir:-.}/results/schema.sql") + 1))
cp "$tmp/s1.db" "$tmp/vnext.db"
q "$tmp/vnext.db" "UPDATE schema_version SET version = $next; PRAGMA journal_mode = delete;" >/dev/null
for bad in foreign empty dir text v3 vnext; do
  f="$tmp/$bad.db"
  before=$( (cd "$tmp" && ls -la "$bad.db"*; [ -f "$f" ] && cksum <"$f") 2>&1)
  refused "merge: $bad input" "$bad.db" "$SB" merge "$tmp/out-$bad.db" "$tmp/s1.db" "$f"
  checks=$((checks + 1))
  [ -e "$tmp/out-$bad.db" ] && fail "merge: $bad input: OUT was created"
  # an empty OUT is a new DB, as for run and sweep
  [ "$bad" = empty ] || refused "merge: $bad OUT" "$bad.db" "$SB" merge "$f" "$tmp/s1.db"
  refused "status: $bad" "$bad.db" "$SB" status --db "$f"
  after=$( (cd "$tmp" && ls -la "$bad.db"*; [ -f "$f" ] && cksum <"$f") 2>&1)
  check "$bad: untouched" "$after" "$before"
done

finish
