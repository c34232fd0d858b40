#!/bin/sh
# verify/mpi-sweep.sh: `shardbench sweep --launcher 'mpirun -np {world}'`, each config its
# own 4-rank job step under the driver's watchdog (world 4, debugmodel block, tiny).
#   1. Three `--shard I/3` sweeps of the f32 half of the list, the first killed with kill -9 in the middle of a
#      step and then resumed: no rank of the killed step is left behind, and the
#      resumed shard has one result per config (none lost, none twice).
#   2. The unsplit sweep with SHARDBENCH_FAULT planting a hang (hang:2: rank 2
#      stops) in one config and a crash (crash:1: rank 1 aborts) in another, out of
#      12 configs that run (f32 and f64): exactly those two are failed, "timeout
#      after T s" and the first rank that died (mpirun's line: rank 1, signal 6)
#      with its own last stderr line; every other f32 row equals the merged shards'
#      row (oracle: the shards ran the same configs in other processes, without
#      faults; keys, statuses, reasons, comm rows), the planted f32 config is ok
#      there, and every other f64 config is ok.
#   3. It ends within 12 x the shards' wall time per step plus one timeout plus a
#      margin.
#   4. It can fail: the comparison sees a merge of two shards only.
# Exits 77 (SKIP) when this build has no MPI (mpi-common.sh) or no sqlite3 CLI.
. "$(dirname "$0")/mpi-common.sh"
NAME=mpi-sweep
. "$(dirname "$0")/harness-common.sh"
unset SHARDBENCH_FAULT

LAUNCH="$MPIRUN --oversubscribe -np {world}"
SW="--world 4 --plans-dir $PLANS --plans dp,fsdp,megatron-tp,hsdp --workloads block --dtypes f32,f64 --batch 4 --seq 8 --steps 1 --warmup 0"
SW="$SW --shapes dp_replicate:4/dp_shard:4/tp:4/dp_replicate:2,dp_shard:2/dp_replicate:2,tp:2"
HANG='plan=dp mesh=dp_replicate:4 dtype=f32 '
CRASH='plan=fsdp mesh=dp_shard:4 dtype=f64 '
# A step takes ~5 s here (mpirun's start, 4 oversubscribed ranks, the reference):
# 20 s is a hang, not a slow step. The margin covers the kill's 3 s grace and a
# loaded machine.
T=20
MARGIN=10
dump() { # dump DB: the f32 rows that must agree, but those of the planted config
  q "$1" "SELECT 'result', c.key, r.status, coalesce(r.reason, '') FROM results r
      JOIN configs c ON c.id = r.config_id
      WHERE instr(c.key, '$HANG') = 0 AND c.dtype = 'f32' ORDER BY c.key, r.id;
    SELECT 'comm', c.key, m.op, m.mesh_dim, m.phase, m.calls, m.payload_bytes, m.wire_bytes
      FROM comm m JOIN results r ON r.id = m.result_id JOIN configs c ON c.id = r.config_id
      WHERE instr(c.key, '$HANG') = 0 AND c.dtype = 'f32'
      ORDER BY 2, 3, 4, 5, 6, 7, 8;"
}
SH=$(echo "$SW" | sed 's/--dtypes f32,f64/--dtypes f32/') # the shards' half
left() { ps -eo args | awk -v p="$1" 'index($0, p) && !/awk/' | wc -l | tr -d ' '; }

# ---- 1. shards, the first killed and resumed ------------------------------------------
t0=$(date +%s)
mkdir "$tmp/k"
# shellcheck disable=SC2086
TMPDIR="$tmp/k" "$SB" sweep $SH --launcher "$LAUNCH" --config-timeout $T --shard 1/3 \
  --db "$tmp/s1.db" >/dev/null 2>"$tmp/k.err" &
pid=$!
i=0
while [ $i -lt 600 ]; do # 60 s at most: the first ok row, then into the next step
  [ "$(q "$tmp/s1.db" "SELECT count(*) FROM results WHERE status = 'ok'" 2>/dev/null)" = 1 ] && break
  sleep 0.1
  i=$((i + 1))
done
# then kill it while a config's step processes run and results are still to come (a
# config takes well under a second, so a fixed sleep could land after the last)
total1=$(q "$tmp/s1.db" "SELECT count(*) FROM configs")
i=0
while [ $i -lt 200 ]; do
  before=$(q "$tmp/s1.db" "SELECT count(*) FROM results")
  running=$(left "$tmp/k/shardbench-sweep")
  [ "$running" -ge 1 ] && [ "$before" -ge 1 ] && [ "$before" -lt "$total1" ] && break
  sleep 0.05
  i=$((i + 1))
done
kill -9 "$pid"
wait "$pid" 2>/dev/null
checks=$((checks + 1))
if [ "$before" -lt 1 ] || [ "$before" -ge "$total1" ] || [ "$running" -lt 1 ]; then
  fail "kill -9: $before of $total1 results, $running step processes: not mid-sweep"
fi
i=0
while [ $i -lt 100 ] && [ "$(left "$tmp/k/shardbench-sweep")" != 0 ]; do # 10 s for mpirun's cleanup
  sleep 0.1
  i=$((i + 1))
done
check "kill -9: no rank of the killed step left" "$(left "$tmp/k/shardbench-sweep")" 0
# shellcheck disable=SC2086
"$SB" sweep $SH --launcher "$LAUNCH" --config-timeout $T --shard 1/3 --resume \
  --db "$tmp/s1.db" >/dev/null 2>"$tmp/e"
check "shard 1/3 resumed: exit" "$?" 0
check "shard 1/3 resumed: one result per config" \
  "$(q "$tmp/s1.db" "SELECT count(*) || ' ' || count(DISTINCT config_id) FROM results")" "$total1 $total1"
for i in 2 3; do
  # shellcheck disable=SC2086
  "$SB" sweep $SH --launcher "$LAUNCH" --config-timeout $T --shard $i/3 --db "$tmp/s$i.db" \
    >/dev/null 2>"$tmp/e"
  check "shard $i/3: exit" "$?" 0
done
t1=$(date +%s)
work=$((t1 - t0))
"$SB" merge "$tmp/m.db" "$tmp/s1.db" "$tmp/s2.db" "$tmp/s3.db" >/dev/null 2>"$tmp/e"
check "merge: exit" "$?" 0
check "merged: 6 configs ran, all ok" \
  "$(q "$tmp/m.db" "SELECT count(*) FROM results WHERE status != 'skipped'") $(q "$tmp/m.db" "SELECT count(*) FROM results WHERE status = 'ok'")" "6 6"
# steps the shards launched: one per config that ran, one more for the killed one
per=$(((work + 6) / 7 + 1))

# ---- 2. the unsplit sweep with a hang and a crash ---------------------------------------
t2=$(date +%s)
mkdir "$tmp/f"
# shellcheck disable=SC2086
SHARDBENCH_FAULT="hang:2@$HANG;crash:1@$CRASH" TMPDIR="$tmp/f" "$SB" sweep $SW --launcher "$LAUNCH" \
  --config-timeout $T --db "$tmp/f.db" >/dev/null 2>"$tmp/f.err"
check "faulted sweep: exit (failures)" "$?" 1
t3=$(date +%s)
checks=$((checks + 1))
[ $((t3 - t2)) -le $((12 * per + T + MARGIN)) ] ||
  fail "faulted sweep took $((t3 - t2)) s, over 12 steps x $per s + timeout $T s + $MARGIN s"
check "faulted sweep: 10 ok, the rest skipped" \
  "$(q "$tmp/f.db" "SELECT count(*) FROM results WHERE status = 'ok'") $(q "$tmp/f.db" "SELECT count(*) FROM results WHERE status NOT IN ('ok', 'failed', 'skipped')")" "10 0"
check "faulted sweep: exactly two failed" \
  "$(q "$tmp/f.db" "SELECT count(*) FROM results WHERE status = 'failed'")" 2
check "the hung config" \
  "$(q "$tmp/f.db" "SELECT r.status || ': ' || r.reason FROM results r JOIN configs c ON c.id = r.config_id WHERE instr(c.key, '$HANG')")" \
  "failed: timeout after $T s (the step killed)"
crash=$(q "$tmp/f.db" "SELECT r.status || ': ' || r.reason FROM results r JOIN configs c ON c.id = r.config_id WHERE instr(c.key, '$CRASH')")
checks=$((checks + 1))
case "$crash" in
  "failed: the step exited "*"rank 1 "*"signal 6"*"last stderr line: shardbench: rank 1: SHARDBENCH_FAULT crash:1: aborting on purpose") ;;
  *) fail "the crashed config: '$crash'" ;;
esac
check "the planted f32 config ran ok in the shards" \
  "$(q "$tmp/m.db" "SELECT group_concat(r.status) FROM results r JOIN configs c ON c.id = r.config_id WHERE instr(c.key, '$HANG')")" "ok"
dump "$tmp/m.db" >"$tmp/m.txt"
dump "$tmp/f.db" >"$tmp/f.txt"
checks=$((checks + 1))
cmp -s "$tmp/m.txt" "$tmp/f.txt" || fail "the other rows differ: $(diff "$tmp/m.txt" "$tmp/f.txt" | head -5)"
check "faulted sweep: no rank of the killed steps left" "$(left "$tmp/f/shardbench-sweep")" 0

# ---- 4. the comparison can fail ---------------------------------------------------------
"$SB" merge "$tmp/m12.db" "$tmp/s1.db" "$tmp/s2.db" >/dev/null 2>&1
dump "$tmp/m12.db" >"$tmp/m12.txt"
checks=$((checks + 1))
cmp -s "$tmp/f.txt" "$tmp/m12.txt" && fail "planted: two shards of three compared equal"

finish
