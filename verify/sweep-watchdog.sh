#!/bin/sh
# verify/sweep-watchdog.sh: the sweep's per-config watchdog on the threads backend
# (each config in its forked child; verify/mpi-sweep.sh does the same for
# --launcher job steps under mpirun).
#   1. A sweep where one config hangs (SHARDBENCH_FAULT hang:1, one rank stops for
#      good) and another crashes (crash:0, a rank aborts) records exactly those two
#      as failed, "timeout after T s" and "died of signal 6" with the crashing
#      rank's own last stderr line, the rest as the fault-free sweep of the same
#      list did (oracle: that sweep's DB), and goes on to the end.
#   2. It ends within the fault-free sweep's time plus one timeout plus a margin.
#   3. It can fail: the timing check sees a hang that is really waited for (with a
#      longer timeout the same sweep takes at least that timeout), and a malformed
#      switch or --config-timeout is bad input.
NAME=sweep-watchdog
. "$(dirname "$0")/harness-common.sh"
unset SHARDBENCH_FAULT

SW="--world 2 --plans-dir $PLANS --plans dp,fsdp,pp --workloads block --dtypes f32 --batch 2 --seq 8 --steps 1 --warmup 0"
HANG='plan=dp mesh=dp_replicate:2 '
CRASH='plan=fsdp mesh=dp_shard:2 '
FAULT="hang:1@$HANG;crash:0@$CRASH"
T=3
# Margin over the fault-free time plus T: the crashed config ends sooner than its
# work, the hung one costs T instead of its work; 6 s covers the kill's grace
# (3 s at most, a SIGKILL'd child goes at once) and a loaded 2-core machine.
MARGIN=6
rows() {
  q "$1" "SELECT c.key, r.status FROM results r JOIN configs c ON c.id = r.config_id
    WHERE instr(c.key, '$HANG') = 0 AND instr(c.key, '$CRASH') = 0 ORDER BY c.key"
}

t0=$(date +%s)
# shellcheck disable=SC2086
"$SB" sweep $SW --db "$tmp/ok.db" >/dev/null 2>&1
check "fault-free sweep: exit" "$?" 0
t1=$(date +%s)
work=$((t1 - t0))

# shellcheck disable=SC2086
SHARDBENCH_FAULT=$FAULT "$SB" sweep $SW --config-timeout $T --db "$tmp/f.db" >"$tmp/o" 2>"$tmp/e"
check "faulted sweep: exit (failures)" "$?" 1
t2=$(date +%s)
took=$((t2 - t1))
checks=$((checks + 1))
[ "$took" -le $((work + T + MARGIN)) ] ||
  fail "faulted sweep took $took s, over the fault-free $work s + timeout $T s + $MARGIN s"
check "faulted sweep: every config has its row" \
  "$(q "$tmp/f.db" "SELECT count(*) FROM results")" "$(q "$tmp/ok.db" "SELECT count(*) FROM results")"
check "exactly two failed" "$(q "$tmp/f.db" "SELECT count(*) FROM results WHERE status = 'failed'")" 2
check "the hung config: timeout" \
  "$(q "$tmp/f.db" "SELECT r.status || ': ' || r.reason FROM results r JOIN configs c ON c.id = r.config_id WHERE instr(c.key, '$HANG')")" \
  "failed: timeout after $T s (the config's process killed)"
check "the crashed config: signal and its last stderr line" \
  "$(q "$tmp/f.db" "SELECT r.status || ': ' || r.reason FROM results r JOIN configs c ON c.id = r.config_id WHERE instr(c.key, '$CRASH')")" \
  "failed: the config's process died of signal 6 (Aborted); last stderr line: shardbench: rank 0: SHARDBENCH_FAULT crash:0: aborting on purpose"
checks=$((checks + 1))
rows "$tmp/ok.db" >"$tmp/ok.txt"
rows "$tmp/f.db" >"$tmp/f.txt"
cmp -s "$tmp/ok.txt" "$tmp/f.txt" || fail "the other configs differ from the fault-free sweep: $(diff "$tmp/ok.txt" "$tmp/f.txt" | head -4)"
check "the other configs: some ran ok" \
  "$(grep -c '|ok$' "$tmp/f.txt" | sed 's/^[1-9][0-9]*$/some/')" some
check "summary line" "$(sed -n 's/.*, \([0-9]* failed\),.*/\1/p' "$tmp/o")" "2 failed"

# ---- 3. the checks can fail --------------------------------------------------------------
T2=8
t3=$(date +%s)
# shellcheck disable=SC2046,SC2086
SHARDBENCH_FAULT="hang:1@$HANG" "$SB" sweep $(echo "$SW" | sed 's/dp,fsdp,pp/dp/') --config-timeout $T2 \
  --db "$tmp/h.db" >/dev/null 2>&1
t4=$(date +%s)
checks=$((checks + 1))
[ $((t4 - t3)) -ge $T2 ] || fail "planted: the hang did not hold the sweep $T2 s (took $((t4 - t3)) s)"
for f in "hang" "hang:x" "crash:1@" "crash:1;;hang:0" "stop:1"; do
  # shellcheck disable=SC2086
  refused "malformed '$f'" SHARDBENCH_FAULT env SHARDBENCH_FAULT="$f" "$SB" sweep $SW --db "$tmp/bad.db"
done
for v in 0 x -3 1e9; do
  # shellcheck disable=SC2086
  refused "--config-timeout $v" "config-timeout" "$SB" sweep $SW --config-timeout "$v" --db "$tmp/bad.db"
done
# shellcheck disable=SC2086
refused "--shard 4/3" "shard" "$SB" sweep $SW --shard 4/3 --db "$tmp/bad.db"
# shellcheck disable=SC2086
refused "--launcher without {world}" "launcher" "$SB" sweep $SW --launcher mpirun --db "$tmp/bad.db"
checks=$((checks + 1))
[ -e "$tmp/bad.db" ] && fail "a refused sweep created the DB"

finish
