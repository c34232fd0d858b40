#!/bin/sh
# verify/pp-timeline.sh: pipeline timelines in the results DB (pp_events, pp_stats,
# pp_stages) and their charts, end to end: `shardbench run` of GPipe, 1F1B and
# interleaved 1F1B plans (written here) on pp 2, 3 and 4 (and pp 2 x dp_replicate 2),
# debugmodel with 2 layers, 4 microbatches (batch 4, microbatch size 1), then checked
# with the sqlite3 CLI against what this script derives itself, not against the
# timeline code:
#   - event count per rank per step: the lowering (lib/parallel/pipeline.h) gives a
#     stage s of S, for each of the m microbatches, its F and B, plus RECV_F and SEND_B
#     when s > 0 and SEND_F and RECV_B when s < S - 1 (every boundary crosses ranks
#     under loop placement with pp > 1); a rank holds stages r, r + p, ... (v of them),
#     and every action, a RECV too (its wait), is one event;
#   - every (step, stage, microbatch) has exactly one F and one B, t1 >= t0 >= 0;
#   - dependencies (one clock: the threads backend): F(s, k) ends before F(s + 1, k)
#     starts, B(s + 1, k) ends before B(s, k) starts, F(s, k) ends before B(s, k);
#   - max_in_flight of pp rank s: min(p - s, m) for 1F1B (warm-up forwards, then one
#     backward before each forward), m for GPipe (all forwards first);
#   - bubble_analytic: (p - 1) / (m + p - 1), (p - 1) / (v m + p - 1) interleaved;
#     bubble_measured recomputed in SQL from pp_events by results/schema.sql's
#     definition (a second implementation of the same definition: a regression check);
#   - `shardbench report` writes pp_bubble.dat and a pp_gantt_RID.dat per result and,
#     with gnuplot, draws pp_bubble.png and pp_gantt_RID.png.
# Each checker is also run on a copy of the DB with a planted defect (one rank's
# events of a step dropped; two F events' times swapped; a stage's in-flight count
# changed) and must report it: the checks can fail.
# With MPI, the pp 2 x dp 2 run again under mpirun -np 4: its counts and in-flight
# figures (the events gathered from every process).
# Skips (77) without the sqlite3 CLI (harness-common.sh).

NAME=pp-timeline.sh
. "$(dirname "$0")/harness-common.sh"

# plans: TorchTitan's pp plan with each schedule
for sc in GPipe 1F1B Interleaved1F1B; do
  printf 'name = pp-%s\ndims = pp:-1, dp_replicate:-1\npipeline_parallel_schedule = %s\npipeline_parallel_microbatch_size = 1\n' \
    "$sc" "$sc" >"$tmp/pp-$sc.plan"
done
DB="$tmp/pp.db"
M=4 # microbatches: batch 4 / microbatch size 1 (no data parallel)
COMMON="--model debugmodel:n_layers=2 --workload model --dtype f32 --batch 4 --seq 8 --steps 2 --warmup 1 --db $DB"
# run SCHEDULE PP [extra flags]: one config; prints its result id
run() {
  sc=$1
  p=$2
  shift 2
  # shellcheck disable=SC2086
  "$SB" run --plan "$tmp/pp-$sc.plan" --pp "$p" $COMMON "$@" >"$tmp/run.out" 2>"$tmp/run.err"
  rc=$?
  checks=$((checks + 1))
  if [ $rc -ne 0 ] || ! grep -q 'status: ok' "$tmp/run.out"; then
    fail "run $sc pp $p $*: exit $rc: $(head -c 400 "$tmp/run.err") $(grep status "$tmp/run.out")"
  fi
  q "$DB" 'SELECT max(id) FROM results'
}
R_1F1B_2=$(run 1F1B 2 --world 2)
R_GPIPE_2=$(run GPipe 2 --world 2)
R_1F1B_3=$(run 1F1B 3 --world 3)
R_GPIPE_3=$(run GPipe 3 --world 3)
R_1F1B_4=$(run 1F1B 4 --world 4)
R_GPIPE_4=$(run GPipe 4 --world 4)
R_INT_2=$(run Interleaved1F1B 2 --world 2)
R_DP=$(run 1F1B 2 --world 4 --dp-replicate 2) # two pipelines of m = 2 (batch 4 over 2 replicas)

# expected_events P V MB RANK: the action count of one rank per step (above)
expected_events() {
  awk -v p="$1" -v v="$2" -v m="$3" -v r="$4" 'BEGIN {
    S = p * v; n = 0
    for (s = r; s < S; s += p) n += 2 * m * (1 + (s > 0) + (s < S - 1))
    print n }'
}

# count_bad DB RID P V MB WORLD: ranks x steps whose event count differs from expected_events
count_bad() {
  bad=0
  for st in 0 1; do
    r=0
    while [ $r -lt "$6" ]; do
      pr=$((r / ($6 / $3))) # pp is the outer mesh dim (TorchTitan's order)
      got=$(q "$1" "SELECT count(*) FROM pp_events WHERE result_id = $2 AND step = $st AND rank = $r")
      [ "$got" = "$(expected_events "$3" "$4" "$5" "$pr")" ] || bad=$((bad + 1))
      r=$((r + 1))
    done
  done
  echo $bad
}
# order_bad DB RID: events out of the dependencies' order, or not one F and one B per
# (rank's pipeline, step, stage, microbatch), or t1 < t0, or t0 < 0
PIPE="(e.rank % (SELECT count(DISTINCT rank) / count(DISTINCT pp_rank) FROM pp_events x WHERE x.result_id = e.result_id))"
order_bad() {
  q "$1" "WITH e AS (SELECT *, rank % (SELECT count(DISTINCT rank) / count(DISTINCT pp_rank) FROM pp_events x WHERE x.result_id = $2) AS pipe FROM pp_events WHERE result_id = $2),
    f AS (SELECT * FROM e WHERE action = 'F'), b AS (SELECT * FROM e WHERE action = 'B')
  SELECT (SELECT count(*) FROM e WHERE t1_s < t0_s OR t0_s < 0)
    + (SELECT count(*) FROM (SELECT 1 FROM e WHERE action IN ('F', 'B') GROUP BY pipe, step, stage, microbatch, action HAVING count(*) != 1))
    + (SELECT count(*) FROM f a JOIN f c ON c.pipe = a.pipe AND c.step = a.step AND c.microbatch = a.microbatch AND c.stage = a.stage + 1 WHERE NOT a.t1_s <= c.t0_s)
    + (SELECT count(*) FROM b a JOIN b c ON c.pipe = a.pipe AND c.step = a.step AND c.microbatch = a.microbatch AND c.stage = a.stage + 1 WHERE NOT c.t1_s <= a.t0_s)
    + (SELECT count(*) FROM f a JOIN b c ON c.pipe = a.pipe AND c.step = a.step AND c.microbatch = a.microbatch AND c.stage = a.stage WHERE NOT a.t1_s <= c.t0_s)"
}
# inflight DB RID: max_in_flight by pp rank, space-separated
inflight() { q "$1" "SELECT group_concat(max_in_flight, ' ') FROM (SELECT max_in_flight FROM pp_stages WHERE result_id = $2 ORDER BY pp_rank)"; }
# expected_inflight SCHEDULE P MB
expected_inflight() {
  awk -v sc="$1" -v p="$2" -v m="$3" 'BEGIN {
    for (s = 0; s < p; s++) { k = sc == "GPipe" ? m : (p - s < m ? p - s : m); o = o (s ? " " : "") k }
    print o }'
}

# ---- the checks on each result ------------------------------------------------------
for cfg in "$R_1F1B_2 1F1B 2 1 $M 2" "$R_GPIPE_2 GPipe 2 1 $M 2" "$R_1F1B_3 1F1B 3 1 $M 3" \
  "$R_GPIPE_3 GPipe 3 1 $M 3" "$R_1F1B_4 1F1B 4 1 $M 4" "$R_GPIPE_4 GPipe 4 1 $M 4" \
  "$R_INT_2 Interleaved1F1B 2 2 $M 2" "$R_DP 1F1B 2 1 2 4"; do
  # shellcheck disable=SC2086
  set -- $cfg
  rid=$1 sc=$2 p=$3 v=$4 m=$5 w=$6
  [ -n "$rid" ] || { fail "$sc pp $p: no result"; continue; }
  check "$sc p $p w $w: pp_stats (schedule pp v m steps)" \
    "$(q "$DB" "SELECT schedule, pp, virtual_stages, microbatches, steps FROM pp_stats WHERE result_id = $rid")" \
    "$sc|$p|$v|$m|2"
  check "$sc p $p w $w: event count per rank per step" "$(count_bad "$DB" "$rid" "$p" "$v" "$m" "$w")" 0
  check "$sc p $p w $w: events in dependency order, one F and B each, t1 >= t0 >= 0" "$(order_bad "$DB" "$rid")" 0
  if [ "$sc" != Interleaved1F1B ]; then
    check "$sc p $p w $w: max_in_flight per stage" "$(inflight "$DB" "$rid")" "$(expected_inflight "$sc" "$p" "$m")"
  fi
  check "$sc p $p w $w: bubble_analytic = (p - 1) / (v m + p - 1)" \
    "$(q "$DB" "SELECT abs(bubble_analytic - ($p - 1.0) / ($v * $m + $p - 1)) < 1e-15 FROM pp_stats WHERE result_id = $rid")" 1
  # REGRESSION: the measured bubble recomputed from the events (one pipeline's span per step)
  check "REGRESSION: $sc p $p w $w: bubble_measured from pp_events" \
    "$(q "$DB" "WITH e AS (SELECT *, $PIPE AS pipe FROM pp_events e WHERE result_id = $rid),
      span AS (SELECT step, pipe, max(t1_s) - min(t0_s) AS s FROM e GROUP BY step, pipe),
      busy AS (SELECT step, rank, pipe, sum(CASE WHEN action IN ('F', 'B') THEN t1_s - t0_s ELSE 0 END) AS b FROM e GROUP BY step, rank)
      SELECT abs(avg(1 - b / s) - (SELECT bubble_measured FROM pp_stats WHERE result_id = $rid)) < 1e-12
      FROM busy JOIN span USING (step, pipe)")" 1
  check "$sc p $p w $w: peak activation bytes > 0 on every stage" \
    "$(q "$DB" "SELECT count(*) FROM pp_stages WHERE result_id = $rid AND peak_act_bytes > 0")" "$p"
done

NPP=8 NSTAGES=22 # results and stages for the report: 2 + 2 + 3 + 3 + 4 + 4 + 2 + 2 stages
# ---- MPI: every process's events reach rank 0 (the gather); clocks per rank, so only
# the counts and the in-flight figures are checked (not the cross-rank order) ----------
if [ "${SB_HAVE_MPI:-no}" = yes ] && [ -n "${MPIRUN:-}" ] && [ "${SB_SANITIZER:-none}" != thread ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" # Open MPI's own allocations
  # shellcheck disable=SC2086
  timeout 300 "$MPIRUN" --oversubscribe -np 4 "$SB" run --backend mpi --world 4 --pp 2 --dp-replicate 2 \
    --plan "$tmp/pp-1F1B.plan" $COMMON >"$tmp/mpi.out" 2>&1
  check "MPI run: exit, status ok" "$?$(grep -c 'status: ok' "$tmp/mpi.out")" 01
  R_MPI=$(q "$DB" 'SELECT max(id) FROM results')
  NPP=9 NSTAGES=24 # its key differs (backend=mpi): one more result of 2 stages
  check "MPI 1F1B p 2 x dp 2: event count per rank per step" "$(count_bad "$DB" "$R_MPI" 2 1 2 4)" 0
  check "MPI 1F1B p 2 x dp 2: max_in_flight per stage" "$(inflight "$DB" "$R_MPI")" "$(expected_inflight 1F1B 2 2)"
  check "MPI 1F1B p 2 x dp 2: t1 >= t0 >= 0" \
    "$(q "$DB" "SELECT count(*) FROM pp_events WHERE result_id = $R_MPI AND NOT (t1_s >= t0_s AND t0_s >= 0)")" 0
else
  echo "$NAME: no MPI in this build: the MPI gather was not checked"
fi

# ---- the checkers catch planted defects ---------------------------------------------
BAD="$tmp/bad.db"
cp "$DB" "$BAD"
q "$BAD" "DELETE FROM pp_events WHERE result_id = $R_1F1B_2 AND rank = 1 AND step = 0"
checks=$((checks + 1))
[ "$(count_bad "$BAD" "$R_1F1B_2" 2 1 $M 2)" -gt 0 ] || fail "planted: rank 1's events of step 0 dropped, count_bad saw nothing"
cp "$DB" "$BAD"
q "$BAD" "UPDATE pp_events SET t0_s = t0_s + 1e3, t1_s = t1_s + 1e3 WHERE result_id = $R_GPIPE_2 AND step = 1 AND stage = 0 AND microbatch = 2 AND action = 'F'"
checks=$((checks + 1))
[ "$(order_bad "$BAD" "$R_GPIPE_2")" -gt 0 ] || fail "planted: a stage-0 F moved after its successors, order_bad saw nothing"
cp "$DB" "$BAD"
q "$BAD" "UPDATE pp_stages SET max_in_flight = $M WHERE result_id = $R_1F1B_4 AND pp_rank = 1"
checks=$((checks + 1))
[ "$(inflight "$BAD" "$R_1F1B_4")" != "$(expected_inflight 1F1B 4 $M)" ] || fail "planted: 1F1B's in-flight count set to m, not seen"

# ---- the report (each run above is a run of its own: --run all) ---------------------
"$SB" report --db "$DB" --run all --out "$tmp/rep" --scripts "${srcdir:-.}/scripts" --format png >"$tmp/rep.out" 2>"$tmp/rep.err"
check "report exit" "$?" 0
check "report: pp_bubble.dat rows (one per result)" "$(grep -vc '^#' "$tmp/rep/data/pp_bubble.dat")" $NPP
check "report: pp_stages.dat rows (one per stage)" "$(grep -vc '^#' "$tmp/rep/data/pp_stages.dat")" $NSTAGES
check "report: the 1F1B p 2 Gantt data holds its last timed step's events" \
  "$(grep -vc '^#' "$tmp/rep/data/pp_gantt_$R_1F1B_2.dat")" \
  "$(q "$DB" "SELECT count(*) FROM pp_events WHERE result_id = $R_1F1B_2 AND step = 1")"
if command -v gnuplot >/dev/null 2>&1 || [ -n "${GNUPLOT:-}" ]; then
  for c in pp_bubble "pp_gantt_$R_1F1B_2" "pp_gantt_$R_INT_2" "pp_gantt_$R_DP"; do
    checks=$((checks + 1))
    magic=$(od -An -tx1 -N8 "$tmp/rep/$c.png" 2>/dev/null | tr -d ' \n')
    [ "$magic" = "89504e470d0a1a0a" ] && grep -qF "src=\"$c.png\"" "$tmp/rep/index.html" ||
      fail "report: $c.png not drawn or not in the index ($(cat "$tmp/rep.err"))"
  done
else
  echo "$NAME: no gnuplot: the chart files were not checked"
fi
finish
