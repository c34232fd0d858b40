#!/bin/sh
# verify/report.sh: `shardbench report` on a small results DB built here by hand
# with the sqlite3 CLI (not by the sweep): two runs, configs of every status, comm
# rows per phase, baselines. Checks the .dat files and their row counts, the
# charts (png and svg, when gnuplot is present), the index page, the run
# selection, the no-gnuplot and empty-DB paths, the memory chart's split (stacked
# from the DB's columns; a schema version 2 DB, which has none, read as peaks only), the
# cp_memory chart on a DB of its own (its .dat in MiB by cp, the groups with one cp value
# left out, the reason when none is drawn, and a DB with other values failing the check),
# a DB of 304 measured configs (300 synthetic ones in 15 plans): every config in the
# .dat files, each plan a panel sorted by the chart's quantity with its best and worst
# marked (against SQL), every PNG at most 1600 px wide (the PNG header, checked on a
# planted 1700 px one); the capacity charts on a fixture of plan runs and predictions
# (the schema version 5 tables): each .dat against a separate SQL query (a planted rank
# swap must fail), the HBM capacity from hbm_gb, hbm_gib and a shipped hardware file,
# the index's ranked table and the layouts that do not fit, the reasons when not drawn;
# and that a non-DB file, a DB of another schema version and bad flags are refused
# with exit 2 and one line, leaving the files unchanged. Skips (77) without the sqlite3 CLI, and at the end
# without gnuplot (the chart checks could not run).
set -u

SB="${top_builddir:-.}/bench/shardbench"
SCRIPTS="${srcdir:-.}/scripts"
SCHEMA="${srcdir:-.}/results/schema.sql"

command -v sqlite3 >/dev/null 2>&1 || { echo "SKIP: no sqlite3 CLI"; exit 77; }
[ -x "$SB" ] || { echo "FAIL: no $SB"; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/sb-report.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# Data rows of a .dat file (comment lines do not count).
rows() { grep -vc '^#' "$1" 2>/dev/null || true; }

# ---- the DB ----
DB="$T/tmp.db"
sqlite3 "$DB" <"$SCHEMA" || { echo "FAIL: schema"; exit 1; }
sqlite3 "$DB" <<'SQL' || { echo "FAIL: populate"; exit 1; }
INSERT INTO schema_version VALUES (4);
INSERT INTO runs VALUES (1, '2026-01-01T00:00:00Z', '2026-01-01T00:10:00Z', 'old-host', '0.1.0',
  'sqlite 3', 'shardbench sweep --world 4', 'threads', 4, NULL, NULL);
INSERT INTO runs VALUES (2, '2026-01-02T00:00:00Z', '2026-01-02T00:10:00Z', 'testhost', '0.1.0',
  'sqlite 3', 'shardbench sweep --world 8', 'threads', 8, NULL, NULL);
-- configs: two plans x two meshes measured, one mismatch, one failed, two skipped
INSERT INTO configs VALUES
 (1, 'k1', 'block', 'debugmodel', 'megatron-tp',      1, 1, 1, 1, 8, 'f32', 8, 64, 3, 'threads', 8),
 (2, 'k2', 'block', 'debugmodel', 'megatron-tp',      1, 2, 1, 1, 4, 'f32', 8, 64, 3, 'threads', 8),
 (3, 'k3', 'block', 'debugmodel', 'torchtitan-tp-sp', 1, 1, 1, 1, 8, 'f32', 8, 64, 3, 'threads', 8),
 (4, 'k4', 'block', 'debugmodel', 'torchtitan-tp-sp', 1, 2, 1, 1, 4, 'f32', 8, 64, 3, 'threads', 8),
 (5, 'k5', 'block', 'debugmodel', 'dp',               1, 8, 1, 1, 1, 'f32', 8, 64, 3, 'threads', 8),
 (6, 'k6', 'block', 'debugmodel', 'dp',               1, 1, 8, 1, 1, 'f32', 8, 64, 3, 'threads', 8),
 (7, 'k7', 'block', 'debugmodel', 'tp-no-loss-parallel', 1, 1, 1, 2, 4, 'f32', 8, 64, 3, 'threads', 8),
 (8, 'k8', 'block', 'debugmodel', 'megatron-tp',      2, 1, 1, 1, 4, 'f32', 8, 64, 3, 'threads', 8);
-- run 1: one old result (must not appear in the latest run's report)
INSERT INTO results (id, run_id, config_id, status, reason, step_time_s, tokens_per_s, tflops, mfu,
  peak_tflops, peak_mem_bytes, max_abs_err, max_rel_err, tolerance, created) VALUES
 (1, 1, 1, 'ok', NULL, 0.5, 1000, 0.1, 0.05, 2, 1000000, 1e-7, 1e-6, 6.1e-5, 'x');
-- run 2 (the memory split of results 2, 3 and 5 is set below; result 4 has a part)
INSERT INTO results (id, run_id, config_id, status, reason, step_time_s, tokens_per_s, tflops, mfu,
  peak_tflops, peak_mem_bytes, max_abs_err, max_rel_err, tolerance, created) VALUES
 (2, 2, 1, 'ok', NULL, 0.10, 5120, 0.50, 0.25, 2, 50000000, 1e-7, 2e-6, 6.1e-5, 'x'),
 (3, 2, 2, 'ok', NULL, 0.12, 4266, 0.42, 0.21, 2, 70000000, 1e-7, 0, 6.1e-5, 'x'),
 (4, 2, 3, 'ok', NULL, 0.09, 5688, 0.55, NULL, NULL, 40000000, 1e-7, 3e-6, 6.1e-5, 'x'),
 (5, 2, 4, 'mismatch', 'layers.0.attention.wq.weight grad step 0: relative error 0.3 over tolerance 6.1e-05 (1 of 38 compared tensors over)', 0.11, 4654, 0.46, 0.23, 2,
    60000000, 0.2, 0.3, 6.1e-5, 'x'),
 (6, 2, 5, 'failed', 'rank 3: out of memory in dt_alloc', NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, 'x'),
 (7, 2, 6, 'skipped', 'plan dp needs dp_replicate, mesh has dp_shard <&> only', NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, 'x'),
 (8, 2, 7, 'skipped', 'cp not supported by this plan', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, 'x');
-- rank 0's split (params, grads, optimizer, activations), each sum under its peak
UPDATE results SET mem_params_bytes = 8000000, mem_grads_bytes = 8000000,
  mem_optimizer_bytes = 16000000, mem_activations_bytes = 12000000 WHERE id = 2;
UPDATE results SET mem_params_bytes = 16000000, mem_grads_bytes = 16000000,
  mem_optimizer_bytes = 32000000, mem_activations_bytes = 5000000 WHERE id = 3;
UPDATE results SET mem_params_bytes = 8000000, mem_grads_bytes = 8000000,
  mem_optimizer_bytes = 16000000, mem_activations_bytes = 20000000 WHERE id = 5;
-- result 4: one part without the others, drawn as no split (a partial stack would
-- put the parts above the missing one at the wrong height)
UPDATE results SET mem_params_bytes = 1000000 WHERE id = 4;
-- comm: per phase and op (result 4 has none: it is dropped from the comm chart)
INSERT INTO comm (result_id, op, mesh_dim, phase, calls, payload_bytes, wire_bytes, seconds) VALUES
 (2, 'all_reduce', 'tp', 'forward', 4, 65536, 114688, 0.001),
 (2, 'all_reduce', 'tp', 'backward', 4, 65536, 114688, 0.001),
 (3, 'all_reduce', 'tp', 'forward', 4, 65536, 98304, 0.001),
 (3, 'all_reduce', 'tp', 'backward', 4, 65536, 98304, 0.001),
 (3, 'all_reduce', 'dp_replicate', 'optimizer', 1, 400000, 400000, 0.002),
 (5, 'all_gather', 'tp', 'forward', 4, 32768, 49152, 0.001),
 (5, 'reduce_scatter', 'tp', 'forward', 4, 32768, 49152, 0.001),
 (5, 'all_gather', 'tp', 'backward', 6, 32768, 73728, 0.001),
 (5, 'reduce_scatter', 'tp', 'backward', 4, 32768, 49152, 0.001),
 (5, 'all_reduce', 'dp_replicate', 'optimizer', 1, 400000, 400000, 0.002);
INSERT INTO baselines (config_id, framework, quantity, value, unit, formula) VALUES
 (1, 'megatron-tp', 'comm_bytes_per_step', 229376, 'bytes', 'a part: not charted alone'),
 (1, 'megatron-tp', 'comm_bytes_per_step_combined', 229376, 'bytes', 'the cross'),
 (1, 'runtime-model', 'comm_bytes_per_step_runtime_model', 245760, 'bytes', 'regression only'),
 (2, 'megatron-tp', 'comm_bytes_per_step', 196608, 'bytes', 'a part: not charted alone'),
 (2, 'ddp', 'comm_bytes_per_step', 400000, 'bytes', 'a part: not charted alone'),
 (2, 'megatron-tp+ddp', 'comm_bytes_per_step_combined', 596608, 'bytes', 'the cross: the sum'),
 (4, 'megatron-tp-sp', 'comm_bytes_per_step_combined', 196608, 'bytes', 'the cross'),
 (1, 'megatron-tp', 'memory_bytes_per_rank', 45000000, 'bytes', 'x'),
 (6, 'zero3', 'comm_bytes_per_step_combined', 1, 'bytes', 'not charted: config 6 was skipped');
SQL

OUT="$T/out"
cp "$DB" "$T/db.before"
"$SB" report --db "$DB" --out "$OUT" --scripts "$SCRIPTS" >"$T/stdout" 2>"$T/stderr"
rc=$?
if [ $rc -eq 0 ]; then pass "report exit 0"; else fail "report exit $rc: $(cat "$T/stderr")"; fi
cmp -s "$DB" "$T/db.before" && pass "DB unchanged by report" || fail "report changed the DB"

# .dat files and row counts (run 2 = latest: 4 measured results, one without comm)
check_rows() { # file expected
  n=$(rows "$OUT/data/$1")
  if [ "$n" = "$2" ]; then pass "$1 has $2 rows"; else fail "$1 has $n rows, expected $2"; fi
  head -n 1 "$OUT/data/$1" | grep -q '^# idx\|^# sid' || fail "$1: no column header"
  sed -n 2p "$OUT/data/$1" | grep -q '^# query: SELECT' || fail "$1: no query line"
}
check_rows comm.dat 10           # 2 + 3 + 5 segments (results 2, 3, 5)
check_rows comm_series.dat 7     # forward and backward: all_gather, all_reduce, reduce_scatter; optimizer: all_reduce
check_rows comm_baselines.dat 3  # one cross per charted config: 1, 2, 4; config 6 skipped
check_rows throughput.dat 4
check_rows memory.dat 4
check_rows memory_baselines.dat 1
check_rows error.dat 4
grep -q 'forward:all_reduce' "$OUT/data/comm_series.dat" || fail "series names"
# the comm crosses: only the combined framework rows (not their parts, not the runtime's
# own closed form), one per config; config 2's is the sum megatron-tp+ddp
if grep -v '^#' "$OUT/data/comm_baselines.dat" | grep -q 'runtime-model'; then
  fail "the runtime model is charted as a framework baseline"
else pass "runtime model not charted"; fi
dup=$(awk '!/^#/ {n[$1]++} END {for (i in n) if (n[i] > 1) print i}' "$OUT/data/comm_baselines.dat")
[ -z "$dup" ] && pass "one cross per config" || fail "configs with several crosses: $dup"
cross=$(awk '!/^#/ && $3 == "megatron-tp+ddp" {print $5}' "$OUT/data/comm_baselines.dat")
[ "$cross" = "596608" ] && pass "config 2's cross is the tp + dp sum" || fail "config 2's cross '$cross', expected 596608"
# series order: forward before backward before optimizer
order=$(grep -v '^#' "$OUT/data/comm_series.dat" | awk '{print $2}' | cut -d: -f1 | uniq | tr '\n' ' ')
[ "$order" = "forward backward optimizer " ] && pass "series in step order" || fail "series order '$order'"
# the stack: top of the last segment of result 3 (config 2) = its total
tot=$(awk '!/^#/ && $2 ~ /megatron-tp\/dpr2.tp4/ {t=$7} END {print t}' "$OUT/data/comm.dat")
[ "$tot" = "596608" ] && pass "stack total" || fail "stack total '$tot', expected 596608"
# throughput sorted by plan, then tokens/s, the most first: megatron-tp's tp8 (5120)
# before its dpr2.tp4 (4266), then torchtitan-tp-sp's tp8 (5688) before dpr2.tp4 (4654)
order=$(awk '!/^#/ {printf "%s:%s:%s:%s ", $4, $3, $12, $13}' "$OUT/data/throughput.dat")
[ "$order" = "megatron-tp:tp8:1:0 megatron-tp:dpr2.tp4:1:1 torchtitan-tp-sp:tp8:2:0 torchtitan-tp-sp:dpr2.tp4:2:1 " ] &&
  pass "throughput sorted by plan (panel), then tokens/s" || fail "throughput order '$order'"
grep -q 'NaN' "$OUT/data/throughput.dat" && pass "NULL mfu written as NaN" || fail "NULL mfu not NaN"
# memory.dat: the split as inserted above, by label (columns 8-11), NaN where NULL
split_of() { # file label: "params grads optimizer activations" of the row with that label
  awk -v l="$2" '!/^#/ && $2 == l {print $8, $9, $10, $11}' "$1"
}
head -n 1 "$OUT/data/memory.dat" | grep -q 'peak_mem_bytes status params_bytes grads_bytes optimizer_bytes activations_bytes pid pos npos mark panel short$' &&
  pass "memory.dat names the split's columns" || fail "memory.dat header: $(head -n 1 "$OUT/data/memory.dat")"
for want in "megatron-tp/tp8 8000000 8000000 16000000 12000000" \
            "megatron-tp/dpr2.tp4 16000000 16000000 32000000 5000000" \
            "torchtitan-tp-sp/dpr2.tp4 8000000 8000000 16000000 20000000" \
            "torchtitan-tp-sp/tp8 NaN NaN NaN NaN"; do
  got="${want%% *} $(split_of "$OUT/data/memory.dat" "${want%% *}")"
  [ "$got" = "$want" ] && pass "memory.dat split: $want" || fail "memory.dat split: got '$got', expected '$want'"
done

# index
IDX="$OUT/index.html"
[ -s "$IDX" ] || fail "no index.html"
for s in 'out of memory in dt_alloc' 'cp not supported by this plan' 'dp_shard &lt;&amp;&gt; only' \
         'relative error 0.3 over tolerance' 'run 2' 'testhost' "$DB"; do
  grep -qF -- "$s" "$IDX" || fail "index lacks '$s'"
done
grep -q 'old-host' "$IDX" && fail "index shows run 1 for --run latest"
pass "index lists the problems and the run"

if command -v gnuplot >/dev/null 2>&1; then
  for c in comm throughput memory error; do
    for f in png svg; do
      [ -s "$OUT/$c.$f" ] || fail "$c.$f missing or empty"
    done
    magic=$(od -An -tx1 -N8 "$OUT/$c.png" | tr -d ' \n')
    [ "$magic" = "89504e470d0a1a0a" ] || fail "$c.png: not a PNG ($magic)"
    grep -q '<svg' "$OUT/$c.svg" || fail "$c.svg: not an SVG"
    grep -qF "src=\"$c.png\"" "$IDX" || fail "index lacks the img for $c"
  done
  pass "charts drawn (png + svg) and listed"
  # the memory chart's stack: one box per config with the split in each part's colour
  # (scripts/memory.gp's part_c: weights, activations; +1 for the key's sample), the
  # key's entries for the parts, the outline (result 4 has no split) and the peak
  boxes() { grep -c "fill = 'rgb($2)'" "$1"; }
  n="$(boxes "$OUT/memory.svg" ' 31, 119, 180') $(boxes "$OUT/memory.svg" '158, 158, 158')"
  [ "$n" = "4 4" ] && pass "memory.svg: 3 configs stacked" ||
    fail "memory.svg: weights and activations boxes '$n', expected '4 4'"
  grep -q 'no split recorded: peak only' "$OUT/memory.svg" && grep -q 'weights (params)' "$OUT/memory.svg" &&
    grep -q 'peak, busiest rank' "$OUT/memory.svg" && pass "memory.svg: the key names parts, outline and peak" ||
    fail "memory.svg: key entries missing"
  # the scripts run by hand, with the documented line, into another directory
  mkdir "$T/byhand"
  for c in comm throughput memory error; do
    gnuplot -e "datadir='$OUT/data'; outdir='$T/byhand'" "$SCRIPTS/$c.gp" 2>"$T/gp.err" &&
      [ -s "$T/byhand/$c.png" ] || fail "$c.gp by hand: $(cat "$T/gp.err")"
  done
  pass "comm, throughput, memory and error run by hand"
  # --format svg only
  "$SB" report --db "$DB" --out "$T/svgonly" --scripts "$SCRIPTS" --format svg >/dev/null 2>&1 &&
    [ -s "$T/svgonly/error.svg" ] && [ ! -e "$T/svgonly/error.png" ] &&
    grep -q 'src="error.svg"' "$T/svgonly/index.html" &&
    pass "--format svg" || fail "--format svg"
  # finding the scripts without --scripts: $SHARDBENCH_SCRIPTS, then ./scripts
  # ./scripts, run from the top of the source tree (the full order: verify/datadir.sh)
  SBABS="$(cd "$(dirname "$SB")" && pwd)/$(basename "$SB")"
  SCABS="$(cd "$SCRIPTS" && pwd)"
  (cd "$T" && SHARDBENCH_SCRIPTS="$SCABS" "$SBABS" report --db tmp.db --out env >/dev/null 2>&1) &&
    [ -s "$T/env/memory.png" ] && pass "scripts from SHARDBENCH_SCRIPTS" || fail "SHARDBENCH_SCRIPTS"
  (cd "$SCABS/.." && env -u SHARDBENCH_SCRIPTS -u SHARDBENCH_DATADIR "$SBABS" report \
    --db "$T/tmp.db" --out "$T/src" >/dev/null 2>&1) &&
    [ -s "$T/src/memory.png" ] && pass "scripts from ./scripts in the working directory" || fail "./scripts"
else
  no_gnuplot=1 # the chart checks did not run: the end says SKIP, not PASS
fi

# ---- a sweep of several hundred configs: every chart at most 1600 px wide ----
# The DB above plus 300 synthetic configs in run 2 (15 plans x 20 meshes; a world-8
# sweep of every shipped plan has a few hundred measured configs), made here by
# sqlite3 in well under a second rather than by a sweep. Every config stays in the
# .dat files; each plan is a panel, its rows sorted by the chart's quantity.
BIG="$T/big.db"
cp "$DB" "$BIG" && sqlite3 "$BIG" <<'SQL' || fail "populate the big DB"
-- 300 synthetic configs in run 2: 15 plans x 20 meshes (pp, dp_replicate, dp_shard in
-- {1, 2}, tp in {1, 2, 4}), each with a result and two comm rows
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 299),
m AS (SELECT i, i % 15 AS p, i / 15 AS j FROM n),
d AS (SELECT i, p, 1 << (j % 2) AS pp, 1 << ((j / 2) % 2) AS dpr, 1 << ((j / 4) % 2) AS dps,
      1 << (j / 8) AS tp FROM m)
INSERT INTO configs (id, key, workload, model, plan, pp, dp_replicate, dp_shard, cp, tp, dtype,
  batch, seq, steps, backend, world)
SELECT 1000 + i, 'syn' || i, 'block', 'debugmodel', 'synplan-' || p, pp, dpr, dps, 1, tp, 'f32',
  8, 64, 3, 'threads', pp * dpr * dps * tp FROM d;
INSERT INTO results (id, run_id, config_id, status, step_time_s, tokens_per_s, tflops, mfu,
  peak_tflops, peak_mem_bytes, max_abs_err, max_rel_err, tolerance, created,
  mem_params_bytes, mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes)
SELECT id, 2, id, CASE WHEN id % 37 = 0 THEN 'mismatch' ELSE 'ok' END, 0.1,
  1000 + (id * 7919) % 1000, 0.5, 0.001 * (100 + (id * 7919) % 1000), 2,
  1048576 * (40 + (id * 104729) % 500), 1e-7, 1e-7 * (1 + id % 13), 6.1e-5, 'x',
  1048576 * 8, 1048576 * 8, 1048576 * 16, 1048576 * (8 + (id * 104729) % 500)
FROM configs WHERE id >= 1000;
INSERT INTO comm (result_id, op, mesh_dim, phase, calls, payload_bytes, wire_bytes, seconds)
SELECT id, 'all_gather', 'dp_shard', 'forward', 2, 1000, 65536 * (1 + id % 17), 0.001
FROM configs WHERE id >= 1000;
INSERT INTO comm (result_id, op, mesh_dim, phase, calls, payload_bytes, wire_bytes, seconds)
SELECT id, 'reduce_scatter', 'dp_shard', 'backward', 2, 1000, 65536 * (1 + id % 23), 0.001
FROM configs WHERE id >= 1000;
SQL
"$SB" report --db "$BIG" --out "$T/big" --scripts "$SCRIPTS" --format png >/dev/null 2>"$T/big.err" ||
  fail "big DB report: $(cat "$T/big.err")"
# The oracle: the measured results of run 2, and those with comm rows, counted by SQL.
NMEAS=$(sqlite3 "$BIG" "SELECT count(*) FROM results WHERE run_id = 2 AND status IN ('ok', 'mismatch')")
NCOMM=$(sqlite3 "$BIG" "SELECT count(DISTINCT r.id) FROM results r JOIN comm c ON c.result_id = r.id
  WHERE r.run_id = 2 AND r.status IN ('ok', 'mismatch')")
[ "$NMEAS" = 304 ] && [ "$NCOMM" = 303 ] || fail "big DB: $NMEAS measured, $NCOMM with comm (expected 304, 303)"
for d in "throughput.dat $NMEAS" "memory.dat $NMEAS" "error.dat $NMEAS"; do
  n=$(rows "$T/big/data/${d% *}")
  [ "$n" = "${d#* }" ] && pass "big DB: ${d% *} keeps all $n configs" || fail "big DB: ${d% *} has $n rows, expected ${d#* }"
done
n=$(awk '!/^#/ {print $1}' "$T/big/data/comm.dat" | sort -u | wc -l)
[ "$n" = "$NCOMM" ] && pass "big DB: comm.dat keeps all $n configs" || fail "big DB: comm.dat has $n configs, expected $NCOMM"
# Each panel is sorted by its quantity (memory: the peak, column 6, ascending within a
# pid, column 12), its pos runs 0..npos-1, and its mark 1 row holds the plan's least peak
# as SQL computes it.
sorted_ok=$(awk '!/^#/ { if ($12 == p && $6 < last) bad++; if ($12 != p && $13 != 0) bad++;
  if ($12 == p && $13 != pos + 1) bad++; p = $12; last = $6; pos = $13 } END {print bad + 0}' "$T/big/data/memory.dat")
[ "$sorted_ok" = 0 ] && pass "big DB: memory.dat sorted by peak within each panel" ||
  fail "big DB: memory.dat: $sorted_ok rows out of order"
# In every chart's .dat (pid pos npos mark at columns P..P+3), each panel's pos runs
# 0..n-1 over its n rows, npos is n on each, and mark is 1 on pos 0 and 2 on pos n-1.
panels_ok() { # file first-place-column
  awk -v c="$2" '!/^#/ { p = $c; n[p]++; if ($(c + 1) != n[p] - 1) bad++; np[p] = $(c + 2);
    if ($(c + 1) == 0 && $(c + 3) != 1) bad++; last[p] = $(c + 3); if (np[p] + 0 != $(c + 2)) bad++ }
    END { for (p in n) { if (np[p] != n[p]) bad++; if (n[p] > 1 && last[p] != 2) bad++ } print bad + 0 }' "$1"
}
for d in throughput.dat:12 memory.dat:12 error.dat:8; do
  bad=$(panels_ok "$T/big/data/${d%:*}" "${d#*:}")
  [ "$bad" = 0 ] && pass "big DB: ${d%:*}'s panels: pos 0..n-1, npos n, the marks" ||
    fail "big DB: ${d%:*}: $bad panel rows wrong"
done
least_sql=$(sqlite3 "$BIG" "SELECT c.plan || ' ' || min(r.peak_mem_bytes) FROM results r JOIN configs c
  ON c.id = r.config_id WHERE r.run_id = 2 AND r.status IN ('ok', 'mismatch') AND r.peak_mem_bytes
  IS NOT NULL GROUP BY c.plan ORDER BY c.plan")
least_dat=$(awk '!/^#/ && $15 == 1 {print $3, $6}' "$T/big/data/memory.dat")
[ "$least_dat" = "$least_sql" ] && pass "big DB: each memory panel's least is the plan's minimum (SQL)" ||
  fail "big DB: memory marks '$least_dat', SQL '$least_sql'"
# The PNG header: bytes 16-19 are the width, big-endian (the IHDR chunk, PNG spec sec. 11.2.2).
png_w() { od -An -tu1 -j16 -N4 "$1" | awk '{print ((($1 * 256) + $2) * 256 + $3) * 256 + $4}'; }
if [ -z "${no_gnuplot:-}" ]; then
  wide=""
  for c in comm throughput memory error; do
    [ -s "$T/big/$c.png" ] || fail "big DB: no $c.png"
  done
  for png in "$T"/big/*.png "$OUT"/*.png; do
    w=$(png_w "$png")
    [ "$w" -le 1600 ] 2>/dev/null || wide="$wide $(basename "$png")=$w"
  done
  [ -z "$wide" ] && pass "big DB and the small one: every PNG at most 1600 px wide" ||
    fail "big DB: charts wider than 1600 px:$wide"
  # the planted bug: png_w must see a chart drawn 1700 px wide as over the limit
  gnuplot -e "set terminal pngcairo size 1700,100; set output '$T/wide.png'; plot x" 2>/dev/null ||
    gnuplot -e "set terminal png size 1700,100; set output '$T/wide.png'; plot x" 2>/dev/null
  [ "$(png_w "$T/wide.png")" = 1700 ] && pass "png_w reads a 1700 px PNG as 1700 (over the limit)" ||
    fail "png_w read $(png_w "$T/wide.png") from a 1700 px PNG"
fi

# --run all: newest result per config; --run 1: the old run only
"$SB" report --db "$DB" --out "$T/all" --scripts "$SCRIPTS" --run all >/dev/null 2>&1 ||
  fail "--run all exit"
[ "$(rows "$T/all/data/error.dat")" = 4 ] && pass "--run all" || fail "--run all rows"
"$SB" report --db "$DB" --out "$T/r1" --scripts "$SCRIPTS" --run 1 >/dev/null 2>&1 ||
  fail "--run 1 exit"
[ "$(rows "$T/r1/data/error.dat")" = 1 ] && grep -q old-host "$T/r1/index.html" &&
  pass "--run 1" || fail "--run 1"

# without gnuplot: the data and the index, one note line, exit 0
GNUPLOT=/nonexistent/gnuplot "$SB" report --db "$DB" --out "$T/nogp" --scripts "$SCRIPTS" \
  >/dev/null 2>"$T/nogp.err"
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$T/nogp.err")" -eq 1 ] && grep -q gnuplot "$T/nogp.err" &&
  [ "$(rows "$T/nogp/data/comm.dat")" = 10 ] && [ -s "$T/nogp/index.html" ] &&
  [ ! -e "$T/nogp/comm.png" ] && pass "no gnuplot: data + index, one note, exit 0" ||
  fail "no gnuplot: rc $rc, stderr '$(cat "$T/nogp.err")'"

# an empty DB (schema only): an index that says so, exit 0
EMPTY="$T/empty.db"
sqlite3 "$EMPTY" <"$SCHEMA" && sqlite3 "$EMPTY" 'INSERT INTO schema_version VALUES (4);'
"$SB" report --db "$EMPTY" --out "$T/empty" --scripts "$SCRIPTS" >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q 'holds no results' "$T/empty/index.html" &&
  [ -e "$T/empty/data/comm.dat" ] && pass "empty DB: index says so, exit 0" ||
  fail "empty DB: rc $rc"

# a schema version 2 DB (version 4 less the pp tables and the split's columns, and
# less the capacity tables where results/schema.sql has them (version 5),
# results/schema.sql's header): read, not upgraded, the split NaN, the memory chart
# drawn from peaks only
V2="$T/v2.db"
cp "$DB" "$V2" && sqlite3 "$V2" "DROP TABLE pp_events; DROP TABLE pp_stats; DROP TABLE pp_stages;
  DROP TABLE IF EXISTS predictions; DROP TABLE IF EXISTS plan_runs; DROP TABLE IF EXISTS hardware;
  ALTER TABLE results DROP COLUMN mem_params_bytes;
  ALTER TABLE results DROP COLUMN mem_grads_bytes; ALTER TABLE results DROP COLUMN mem_optimizer_bytes;
  ALTER TABLE results DROP COLUMN mem_activations_bytes; UPDATE schema_version SET version = 2;
  PRAGMA journal_mode = delete;" >/dev/null || fail "making the v2 DB"
cp "$V2" "$T/v2.before"
"$SB" report --db "$V2" --out "$T/v2" --scripts "$SCRIPTS" >/dev/null 2>"$T/v2.err"
rc=$?
[ $rc -eq 0 ] && cmp -s "$V2" "$T/v2.before" && pass "v2 DB: read (exit 0), left unchanged" ||
  fail "v2 DB: rc $rc, $(cat "$T/v2.err")"
[ "$(rows "$T/v2/data/memory.dat")" = 4 ] &&
  [ "$(awk '!/^#/ && $6 > 0 && $8 $9 $10 $11 == "NaNNaNNaNNaN"' "$T/v2/data/memory.dat" | wc -l)" = 4 ] &&
  pass "v2 DB: memory.dat has the 4 peaks, the split NaN" || fail "v2 DB: memory.dat $(cat "$T/v2/data/memory.dat")"
if [ -z "${no_gnuplot:-}" ]; then
  [ -s "$T/v2/memory.svg" ] && grep -q 'no split recorded: peak only' "$T/v2/memory.svg" &&
    ! grep -q 'weights (params)' "$T/v2/memory.svg" && pass "v2 DB: memory chart of peaks only" ||
    fail "v2 DB: memory chart"
fi

# ---- cp_memory: peak memory per rank against cp, for a fixed global sequence ----
# The main DB above has no measured cp config: the chart is listed, not drawn, and says why.
[ "$(rows "$OUT/data/cp_memory.dat")" = 0 ] && [ ! -e "$OUT/cp_memory.png" ] &&
  grep -q '<h2 id="cp_memory">' "$IDX" &&
  grep -q 'Not drawn: no measured config with a cp dim' "$IDX" &&
  pass "cp_memory: no cp config, listed with the reason" || fail "cp_memory: empty case"
# A DB of its own. Group A (fsdp, dps2, global seq 64) at cp 4, 1, 2 (inserted out of
# order), one mismatched, one without the activations; run 1 holds an older cp 2 result
# that the newest must replace, and config 8, config 3's fields under another key text,
# an older one (one point per cp: the newest result). Groups that must not be drawn, each with one measured cp
# value: B (tp4 at cp 2), C (group A at another global seq: 128 at cp 2, so seq is in
# the group), D (group A less dp_shard, with its cp 2 config failed: no peak).
# Bytes are whole MiB (2^20), so the .dat's MiB are the numbers below exactly.
CPDB="$T/cp.db"
sqlite3 "$CPDB" <"$SCHEMA" && sqlite3 "$CPDB" <<'SQL' || fail "populate the cp DB"
INSERT INTO schema_version VALUES (4);
INSERT INTO runs VALUES (1, '2026-01-01T00:00:00Z', '2026-01-01T00:10:00Z', 'h', '0.1.0',
  'sqlite 3', 'shardbench sweep', 'threads', 8, NULL, NULL);
INSERT INTO runs VALUES (2, '2026-01-02T00:00:00Z', '2026-01-02T00:10:00Z', 'h', '0.1.0',
  'sqlite 3', 'shardbench sweep', 'threads', 8, NULL, NULL);
INSERT INTO configs VALUES
 (1, 'a4', 'block', 'debugmodel', 'fsdp', 1, 1, 2, 4, 1, 'f32', 8, 64, 3, 'threads', 8),
 (2, 'a1', 'block', 'debugmodel', 'fsdp', 1, 1, 2, 1, 1, 'f32', 8, 64, 3, 'threads', 2),
 (3, 'a2', 'block', 'debugmodel', 'fsdp', 1, 1, 2, 2, 1, 'f32', 8, 64, 3, 'threads', 4),
 (4, 'b2', 'block', 'debugmodel', 'tp',   1, 1, 1, 2, 4, 'f32', 8, 64, 3, 'threads', 8),
 (5, 'c2', 'block', 'debugmodel', 'fsdp', 1, 1, 2, 2, 1, 'f32', 8, 128, 3, 'threads', 4),
 (6, 'd1', 'block', 'debugmodel', 'fsdp', 1, 1, 1, 1, 1, 'f32', 8, 64, 3, 'threads', 1),
 (7, 'd2', 'block', 'debugmodel', 'fsdp', 1, 1, 1, 2, 1, 'f32', 8, 64, 3, 'threads', 2),
 (8, 'a2 in an older key format', 'block', 'debugmodel', 'fsdp', 1, 1, 2, 2, 1, 'f32', 8, 64, 3,
  'threads', 4);
INSERT INTO results (id, run_id, config_id, status, reason, peak_mem_bytes, created,
  mem_activations_bytes) VALUES
 (1, 1, 3, 'ok', NULL, 1047527424, 'x', 1048576),        -- 999 MiB, replaced by result 5
 (2, 2, 8, 'ok', NULL, 814743552, 'x', 1048576),         -- 777 MiB, config 3's twin: older than 5
 (3, 2, 1, 'ok', NULL, 44040192, 'x', 10485760),         -- 42 MiB, 10 MiB
 (4, 2, 2, 'ok', NULL, 104857600, 'x', 52428800),        -- 100 MiB, 50 MiB
 (5, 2, 3, 'mismatch', 'x', 62914560, 'x', NULL),        -- 60 MiB, activations not recorded
 (6, 2, 4, 'ok', NULL, 20971520, 'x', 5242880),
 (7, 2, 5, 'ok', NULL, 73400320, 'x', 31457280),
 (8, 2, 6, 'ok', NULL, 83886080, 'x', 41943040),
 (9, 2, 7, 'failed', 'out of memory', NULL, 'x', NULL);
SQL
# The rows expected in cp_memory.dat (gid label cp peak_mib activations_mib status), by cp.
CP_WANT='1 fsdp/pp1.dpr1.dps2.tp1/b8s64 1 100 50 ok
1 fsdp/pp1.dpr1.dps2.tp1/b8s64 2 60 NaN mismatch
1 fsdp/pp1.dpr1.dps2.tp1/b8s64 4 42 10 ok'
check_cp() { # DB OUTDIR [flags]: 0 when the report's cp_memory.dat holds CP_WANT exactly
  db=$1; out=$2; shift 2
  "$SB" report --db "$db" --out "$out" --scripts "$SCRIPTS" "$@" >/dev/null 2>"$out.err" || return 1
  got=$(awk '!/^#/ {print $1, $2, $3, $4, $5, $6}' "$out/data/cp_memory.dat")
  [ "$got" = "$CP_WANT" ] || { printf '%s\n' "$got" >"$out.got"; return 1; }
  head -n 1 "$out/data/cp_memory.dat" | grep -q '^# gid label cp peak_mib activations_mib status' ||
    return 1
}
if check_cp "$CPDB" "$T/cp"; then pass "cp_memory.dat: group A in MiB by cp, the newest result per cp, B, C, D not drawn"
else fail "cp_memory.dat: got '$(cat "$T/cp.got" 2>/dev/null)' $(cat "$T/cp.err")"; fi
check_cp "$CPDB" "$T/cpall" --run all &&
  pass "cp_memory --run all: the newest result per config (not run 1's 999 MiB)" ||
  fail "cp_memory --run all: got '$(cat "$T/cpall.got" 2>/dev/null)'"
grep -q '(3 configs in 1 series)' "$T/cp/index.html" && pass "cp_memory: index counts 3 configs, 1 series" ||
  fail "cp_memory: index count"
# The check can fail: the same report of a DB whose values differ, or where group B
# gains a second cp value (so it must be drawn), is refused by check_cp.
cp "$CPDB" "$T/cp-bad1.db" && sqlite3 "$T/cp-bad1.db" 'UPDATE results SET peak_mem_bytes = 45088768 WHERE id = 3;' ||
  fail "making cp-bad1.db"
# (the .got file: check_cp failed on the content, not on the report's exit)
if check_cp "$T/cp-bad1.db" "$T/cpbad1" || [ ! -s "$T/cpbad1.got" ]; then
  fail "check_cp passed a DB with cp 4 at 43 MiB, or the report failed"
else pass "check_cp fails on a DB whose cp 4 peak is 43 MiB"; fi
cp "$CPDB" "$T/cp-bad2.db" && sqlite3 "$T/cp-bad2.db" "INSERT INTO configs VALUES (9, 'b4', 'block',
  'debugmodel', 'tp', 1, 1, 1, 4, 4, 'f32', 8, 64, 3, 'threads', 16);
  INSERT INTO results (run_id, config_id, status, peak_mem_bytes, created) VALUES (2, 9, 'ok', 1048576, 'x');" ||
  fail "making cp-bad2.db"
if check_cp "$T/cp-bad2.db" "$T/cpbad2" || [ ! -s "$T/cpbad2.got" ]; then
  fail "check_cp passed a DB with group B at two cp values, or the report failed"
else pass "check_cp fails when group B has two cp values (drawn)"; fi
# run 1 alone: a cp config, but no group with two cp values: listed, with that reason
"$SB" report --db "$CPDB" --out "$T/cp1" --scripts "$SCRIPTS" --run 1 >/dev/null 2>&1
[ "$(rows "$T/cp1/data/cp_memory.dat")" = 0 ] && [ ! -e "$T/cp1/cp_memory.png" ] &&
  grep -q 'Not drawn: no series: no group of configs that differ only in cp' "$T/cp1/index.html" &&
  pass "cp_memory: one cp value per group, listed with the reason" || fail "cp_memory: run 1"
if [ -z "${no_gnuplot:-}" ]; then
  magic=$(od -An -tx1 -N8 "$T/cp/cp_memory.png" | tr -d ' \n')
  [ "$magic" = "89504e470d0a1a0a" ] && grep -q '<svg' "$T/cp/cp_memory.svg" &&
    grep -q 'src="cp_memory.png"' "$T/cp/index.html" && pass "cp_memory: png + svg drawn and listed" ||
    fail "cp_memory: chart not drawn ($magic): $(grep -v '^\$' "$T/cp/gnuplot.log")"
  # the key: group A's peak and activations, nothing of B, C, D, and the mismatch ring
  grep -q 'fsdp/pp1.dpr1.dps2.tp1/b8s64 peak' "$T/cp/cp_memory.svg" &&
    grep -q 'fsdp/pp1.dpr1.dps2.tp1/b8s64 activations (rank 0)' "$T/cp/cp_memory.svg" &&
    grep -q 'mismatch (wrong result)' "$T/cp/cp_memory.svg" &&
    ! grep -q 'b8s128\|tp/pp1\|dps1.tp1' "$T/cp/cp_memory.svg" &&
    pass "cp_memory.svg: the key names group A's two lines and the mismatch only" ||
    fail "cp_memory.svg: key"
fi

# ---- capacity charts: the plan_runs, predictions and hardware tables (schema version 5) ----
# A DB without those tables (the v2 DB above; the main DB, until results/schema.sql has
# them) lists the charts, not drawn, with the reason.
grep -q 'Not drawn: this DB (schema version 2) has no plan_runs and predictions tables' "$T/v2/index.html" &&
  [ ! -e "$T/v2/capacity_memory.png" ] && pass "capacity: a v2 DB lists the charts, not drawn, and says why" ||
  fail "capacity: v2 DB's index"
grep -q '<h2 id="capacity_memory">' "$IDX" &&
  grep -q 'Not drawn: this DB (schema version [0-9]*) has no plan_runs\|Not drawn: no plan_runs rows' "$IDX" &&
  [ ! -e "$OUT/capacity_memory.png" ] && pass "capacity: a DB of sweeps only: not drawn" || fail "capacity: main DB's index"
# The fixture: the schema, the capacity tables' DDL (the text the planner's schema
# version 5 adds; IF NOT EXISTS, so a no-op once results/schema.sql has it), the
# schema version results/schema.sql states, and by sqlite3: a sweep run, a plan run
# (run 2: 8, 16, 32 and 64 GPUs, 8 GPUs planned twice: the newest counts) and a
# newer sweep run (3, the latest: the capacity charts read the newest run with plan runs).
SBVER=$(sed -n 's/^  version INTEGER NOT NULL *-- *\([0-9]*\).*/\1/p' "$SCHEMA")
[ -n "$SBVER" ] || { fail "results/schema.sql states no version (its schema_version comment)"; SBVER=4; }
CAPDB="$T/cap.db"
sqlite3 "$CAPDB" <"$SCHEMA" && sqlite3 "$CAPDB" "INSERT INTO schema_version VALUES ($SBVER);" &&
  sqlite3 "$CAPDB" <<'SQL' || fail "populate the capacity DB"
CREATE TABLE IF NOT EXISTS hardware (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, text TEXT NOT NULL, UNIQUE (name, text));
CREATE TABLE IF NOT EXISTS plan_runs (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
  hardware_id INTEGER NOT NULL REFERENCES hardware(id),
  model TEXT NOT NULL, gpus INTEGER NOT NULL, seq INTEGER NOT NULL,
  global_batch INTEGER NOT NULL, dtype TEXT NOT NULL,
  tokens REAL,
  features TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS predictions (
  id INTEGER PRIMARY KEY,
  plan_run_id INTEGER NOT NULL REFERENCES plan_runs(id) ON DELETE CASCADE,
  rank INTEGER,
  plan TEXT NOT NULL,
  pp INTEGER NOT NULL, dp_replicate INTEGER NOT NULL, dp_shard INTEGER NOT NULL,
  cp INTEGER NOT NULL, tp INTEGER NOT NULL,
  ac TEXT NOT NULL,
  local_batch INTEGER NOT NULL,
  accum_steps INTEGER NOT NULL,
  microbatches INTEGER NOT NULL,
  schedule TEXT,
  fits INTEGER NOT NULL,
  peak_bytes REAL NOT NULL,
  over_bytes REAL,
  mem_params_bytes REAL NOT NULL, mem_grads_bytes REAL NOT NULL,
  mem_optimizer_bytes REAL NOT NULL, mem_activations_bytes REAL NOT NULL,
  step_s REAL NOT NULL, compute_s REAL NOT NULL, recompute_s REAL NOT NULL, bubble_s REAL NOT NULL,
  exposed_pp_s REAL NOT NULL, exposed_dp_replicate_s REAL NOT NULL, exposed_dp_shard_s REAL NOT NULL,
  exposed_cp_s REAL NOT NULL, exposed_tp_s REAL NOT NULL,
  tokens_per_s_per_gpu REAL NOT NULL, mfu REAL NOT NULL,
  train_s REAL, gpu_hours REAL,
  verdict TEXT, verify_reason TEXT);
INSERT INTO runs VALUES (1, '2026-01-01T00:00:00Z', '2026-01-01T00:10:00Z', 'h', '0.1.0',
  'sqlite 3', 'shardbench sweep --world 8', 'threads', 8, NULL, NULL);
INSERT INTO runs VALUES (2, '2026-01-02T00:00:00Z', '2026-01-02T00:01:00Z', 'h', '0.1.0',
  'sqlite 3', 'shardbench plan --gpus 8,16,32,64', 'threads', 1, NULL, NULL);
INSERT INTO runs VALUES (3, '2026-01-03T00:00:00Z', '2026-01-03T00:10:00Z', 'h', '0.1.0',
  'sqlite 3', 'shardbench sweep --world 4', 'threads', 4, NULL, NULL);
INSERT INTO hardware VALUES (1, 'h100-sxm',
  'name = h100-sxm  # NVIDIA H100 Tensor Core GPU datasheet
peak_bf16_tflops = 989  # NVIDIA H100 datasheet, dense
hbm_gb = 80  # NVIDIA H100 datasheet: 80 GB HBM3
');
-- plan run 1: an older 8-GPU plan of run 2, replaced by plan run 2 (same gpus)
INSERT INTO plan_runs VALUES (1, 2, 1, '8B', 8, 8192, 256, 'bf16', NULL, ''),
 (2, 2, 1, '8B', 8, 8192, 256, 'bf16', NULL, 'compile'),
 (3, 2, 1, '8B', 16, 8192, 256, 'bf16', NULL, 'compile'),
 (4, 2, 1, '8B', 32, 8192, 256, 'bf16', NULL, 'compile'),
 (5, 2, 1, '8B', 64, 8192, 256, 'bf16', 1e9, 'compile');
-- per plan run, 3 plans (k) x 8 layouts (j: tp = 2^(j % 4), ac none or full): the peak
-- falls with the GPUs and tp (and full recompute), pp-fsdp (k 2) fits at 32 GPUs on;
-- plan run 1's tokens/s are 10000 higher than any other, so reading it shows.
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 119),
l AS (SELECT i, 1 + i / 24 AS pr, (i / 8) % 3 AS k, i % 8 AS j FROM n),
g AS (SELECT l.*, p.gpus, 1 << (j % 4) AS tp, j / 4 AS full,
      20e9 + 480e9 * 8.0 / (p.gpus * (1 << (j % 4))) * (CASE WHEN j / 4 = 1 THEN 0.5 ELSE 1 END)
        + 5e9 * k + (CASE WHEN k = 2 THEN 100e9 * 8.0 / p.gpus ELSE 0 END) AS peak,
      3000 - 200 * (j % 4) - 500 * (j / 4) - 100 * k - p.gpus + (CASE WHEN pr = 1 THEN 10000 ELSE 0 END) AS tok
      FROM l JOIN plan_runs p ON p.id = l.pr)
INSERT INTO predictions (id, plan_run_id, rank, plan, pp, dp_replicate, dp_shard, cp, tp, ac,
  local_batch, accum_steps, microbatches, schedule, fits, peak_bytes, over_bytes,
  mem_params_bytes, mem_grads_bytes, mem_optimizer_bytes, mem_activations_bytes,
  step_s, compute_s, recompute_s, bubble_s, exposed_pp_s, exposed_dp_replicate_s,
  exposed_dp_shard_s, exposed_cp_s, exposed_tp_s, tokens_per_s_per_gpu, mfu, train_s, gpu_hours,
  verdict, verify_reason)
SELECT i + 1, pr, NULL, CASE k WHEN 0 THEN 'fsdp' WHEN 1 THEN 'fsdp-tp-sp' ELSE 'pp-fsdp' END,
  CASE WHEN k = 2 THEN 2 ELSE 1 END, 1, gpus / tp / (CASE WHEN k = 2 THEN 2 ELSE 1 END), 1, tp,
  CASE WHEN full = 1 THEN 'full' ELSE 'none' END, 1, 256 / (gpus / tp), CASE WHEN k = 2 THEN 8 ELSE 1 END,
  CASE WHEN k = 2 THEN '1F1B' END, peak <= 80e9, peak, CASE WHEN peak > 80e9 THEN peak - 80e9 END,
  1e9, 1e9, 2e9, peak - 4e9,
  256 * 8192.0 / (tok * gpus), 0.6 * 256 * 8192.0 / (tok * gpus),
  (CASE WHEN full = 1 THEN 0.2 ELSE 0 END) * 256 * 8192.0 / (tok * gpus),
  (CASE WHEN k = 2 THEN 0.1 ELSE 0 END) * 256 * 8192.0 / (tok * gpus), 0, 0,
  (0.4 - (CASE WHEN full = 1 THEN 0.2 ELSE 0 END) - (CASE WHEN k = 2 THEN 0.1 ELSE 0 END)) / 2 * 256 * 8192.0 / (tok * gpus),
  0, (0.4 - (CASE WHEN full = 1 THEN 0.2 ELSE 0 END) - (CASE WHEN k = 2 THEN 0.1 ELSE 0 END)) / 2 * 256 * 8192.0 / (tok * gpus),
  tok, tok / 10000.0, NULL, NULL, CASE WHEN i % 5 = 0 THEN 'ok' END, NULL
FROM g;
-- rank: 1 = the fastest that fits, per plan run
UPDATE predictions SET rank = (SELECT count(*) FROM predictions q WHERE q.plan_run_id =
  predictions.plan_run_id AND q.fits AND (q.tokens_per_s_per_gpu > predictions.tokens_per_s_per_gpu
  OR (q.tokens_per_s_per_gpu = predictions.tokens_per_s_per_gpu AND q.id < predictions.id))) + 1
WHERE fits;
-- plan run 5 was given --tokens 1e9: the training time of each layout that fits
UPDATE predictions SET train_s = 1e9 / (tokens_per_s_per_gpu * 64),
  gpu_hours = 1e9 / (tokens_per_s_per_gpu * 64) * 64 / 3600 WHERE plan_run_id = 5 AND fits;
SQL
"$SB" report --db "$CAPDB" --out "$T/cap" --scripts "$SCRIPTS" >/dev/null 2>"$T/cap.err" ||
  fail "capacity report: $(cat "$T/cap.err")"
CAPIDX="$T/cap/index.html"
# The oracle for capacity_throughput.dat: per plan and GPU count, the largest tokens/s
# per GPU of a layout that fits, in the newest plan run of that count (SQL's max).
cap_thr_sql() { sqlite3 "$1" "SELECT p.plan || ' ' || pr.gpus || ' ' || printf('%.9g', max(p.tokens_per_s_per_gpu))
  FROM predictions p JOIN plan_runs pr ON pr.id = p.plan_run_id WHERE p.fits AND pr.id IN
  (SELECT max(id) FROM plan_runs WHERE run_id = (SELECT max(run_id) FROM plan_runs) GROUP BY gpus)
  GROUP BY p.plan, pr.gpus ORDER BY p.plan, pr.gpus"; }
check_cap_thr() { # DB OUTDIR: 0 when capacity_throughput.dat's best per plan is SQL's max
  # the data only (no gnuplot: the charts are checked below), to keep the test fast
  GNUPLOT=/nonexistent/gnuplot "$SB" report --db "$1" --out "$2" --scripts "$SCRIPTS" >/dev/null 2>&1 ||
    return 1
  got=$(awk '!/^#/ {print $2, $1, $5}' "$2/data/capacity_throughput.dat")
  want=$(cap_thr_sql "$1")
  [ -n "$want" ] && [ "$got" = "$want" ] || { printf '%s\n--\n%s\n' "$got" "$want" >"$2.diff"; return 1; }
}
if check_cap_thr "$CAPDB" "$T/capthr"; then
  pass "capacity_throughput.dat: per plan and GPU count the fastest layout that fits ($(rows "$T/capthr/data/capacity_throughput.dat") points; pp-fsdp fits from 32 GPUs)"
else fail "capacity_throughput.dat against SQL: $(cat "$T/capthr.diff" 2>/dev/null)"; fi
# the label: best = 1 on the fastest fitting layout at each GPU count over all plans (SQL)
got=$(awk '!/^#/ && $9 == 1 {print $1, $5}' "$T/capthr/data/capacity_throughput.dat" | sort -n)
want=$(sqlite3 "$CAPDB" "SELECT pr.gpus || ' ' || printf('%.9g', max(p.tokens_per_s_per_gpu)) FROM predictions p
  JOIN plan_runs pr ON pr.id = p.plan_run_id WHERE p.fits AND pr.id IN (SELECT max(id) FROM plan_runs
  WHERE run_id = 2 GROUP BY gpus) GROUP BY pr.gpus ORDER BY pr.gpus")
[ -n "$want" ] && [ "$got" = "$want" ] && pass "capacity_throughput.dat: the fastest at each GPU count marked best" ||
  fail "capacity_throughput.dat best: got '$got', SQL '$want'"
# The planted bug: swap 64 GPUs' ranks 1 and 2 (both fsdp), so that rank 1 is not the
# fastest: the .dat follows the ranks, and the check must fail.
cp "$CAPDB" "$T/cap-bad.db" && sqlite3 "$T/cap-bad.db" "UPDATE predictions SET rank = 3 - rank
  WHERE plan_run_id = 5 AND rank IN (1, 2);" || fail "making cap-bad.db"
if check_cap_thr "$T/cap-bad.db" "$T/capbad" || [ ! -s "$T/capbad.diff" ]; then
  fail "check_cap_thr passed a DB whose rank 1 is not the fastest"
else pass "check_cap_thr fails on a DB whose rank 1 at 64 GPUs is the slower fsdp layout"; fi
# capacity_memory.dat: per plan and GPU count the best ranked layout that fits, else the
# smallest peak (SQL: the row with the least of rank, or 1e9 + its peak where it does not fit;
# SQLite's min() takes the bare columns from that row), in GB.
want=$(sqlite3 "$CAPDB" "SELECT plan || ' ' || gpus || ' ' || printf('%.9g', peak / 1e9) || ' ' || fits, min(k) FROM
  (SELECT p.plan AS plan, pr.gpus AS gpus, p.peak_bytes AS peak, p.fits AS fits,
   CASE WHEN p.fits THEN p.rank ELSE 1e9 + p.peak_bytes END AS k FROM predictions p JOIN plan_runs pr
   ON pr.id = p.plan_run_id WHERE pr.id IN (SELECT max(id) FROM plan_runs WHERE run_id = 2 GROUP BY gpus))
  GROUP BY plan, gpus ORDER BY plan, gpus" | cut -d'|' -f1)
got=$(awk '!/^#/ {print $2, $1, $5, $6}' "$T/cap/data/capacity_memory.dat")
[ "$got" = "$want" ] && pass "capacity_memory.dat: per plan and GPU count the chosen layout's peak (12 points, 2 that do not fit)" ||
  fail "capacity_memory.dat: got '$got', SQL '$want'"
# End to end: the tables as `shardbench plan` writes them (debugmodel, two plans, 8 and
# 16 GPUs: a fraction of a second), the same check against SQL.
PLANDB="$T/plan.db"
if "$SB" plan --model debugmodel --gpus 8,16 --hardware "${srcdir:-.}/results/hardware/h100-sxm-80gb" \
     --global-batch 16 --seq 256 --plans tt-fsdp,tt-fsdp-tp --ac none --local-batch 1 \
     --plans-dir "${srcdir:-.}/plans" --db "$PLANDB" >"$T/plan.out" 2>&1; then
  if check_cap_thr "$PLANDB" "$T/planrep" && [ "$(rows "$T/planrep/data/capacity_memory.dat")" = 4 ]; then
    pass "shardbench plan's DB: capacity_throughput.dat against SQL, 4 capacity_memory points"
  else fail "shardbench plan's DB: $(cat "$T/planrep.diff" 2>/dev/null)"; fi
else fail "shardbench plan for the report: $(tail -n 2 "$T/plan.out")"; fi
# the capacity: hbm_gb = 80 of the hardware text, at each of the 4 GPU counts
got=$(awk '!/^#/ {printf "%s:%s ", $1, $2}' "$T/cap/data/capacity_hw.dat")
[ "$got" = "8:80 16:80 32:80 64:80 " ] && pass "capacity_hw.dat: hbm_gb 80 at each GPU count" ||
  fail "capacity_hw.dat: '$got'"
# the shipped hardware files give hbm_gib (results/hardware/README): 80 GiB is
# 80 x 2^30 = 85.89934592e9 bytes; hbm_gbps, another key, is not read
cp "$CAPDB" "$T/cap-gib.db" && sqlite3 "$T/cap-gib.db" "UPDATE hardware SET text = 'name = x
hbm_gbps = 9  # not the capacity
hbm_gib = 80  # a GiB capacity';" || fail "making cap-gib.db"
GNUPLOT=/nonexistent/gnuplot "$SB" report --db "$T/cap-gib.db" --out "$T/capgib" --scripts "$SCRIPTS" >/dev/null 2>&1
got=$(awk '!/^#/ {printf "%s ", $2}' "$T/capgib/data/capacity_hw.dat")
[ "$got" = "85.8993459 85.8993459 85.8993459 85.8993459 " ] &&
  pass "capacity_hw.dat: hbm_gib 80 is 85.8993459 GB (9 digits; hbm_gbps is not read)" || fail "capacity_hw.dat from hbm_gib: '$got'"
# a shipped hardware file as shardbench plan stores it (its whole text): the capacity
# its hbm_gib or hbm_gb line gives, as awk reads the file
HWF="${srcdir:-.}/results/hardware/h100-sxm-80gb"
if [ -f "$HWF" ]; then
  want=$(awk '$1 == "hbm_gib" && $2 == "=" {printf "%.9g", $3 * 2^30 / 1e9; exit}
    $1 == "hbm_gb" && $2 == "=" {printf "%.9g", $3; exit}' "$HWF")
  cp "$CAPDB" "$T/cap-hw.db" && sqlite3 "$T/cap-hw.db" "UPDATE hardware SET text = CAST(readfile('$HWF') AS TEXT);" ||
    fail "making cap-hw.db"
  GNUPLOT=/nonexistent/gnuplot "$SB" report --db "$T/cap-hw.db" --out "$T/caphw" --scripts "$SCRIPTS" >/dev/null 2>&1
  got=$(awk '!/^#/ {print $2; exit}' "$T/caphw/data/capacity_hw.dat")
  [ -n "$want" ] && [ "$got" = "$want" ] && pass "capacity_hw.dat: h100-sxm-80gb's HBM is $got GB" ||
    fail "capacity_hw.dat from h100-sxm-80gb: '$got', the file says '$want'"
fi
# capacity_breakdown.dat: the newest plan run's (64 GPUs) first 20 of its 22 ranked
# layouts, by rank, each stack summing to its step time (to 1e-6: the .dat's 9 digits).
got=$(awk '!/^#/ {printf "%s ", $2}' "$T/cap/data/capacity_breakdown.dat")
want=$(seq 1 20 | tr '\n' ' ')
[ "$got" = "$want" ] && pass "capacity_breakdown.dat: ranks 1 to 20 of 22" || fail "capacity_breakdown.dat ranks '$got'"
bad=$(awk '!/^#/ {t = 0; for (k = 6; k <= 13; k++) t += $k; d = t - $14; if (d < 0) d = -d;
  if (d > 1e-6 * $14) n++} END {print n + 0}' "$T/cap/data/capacity_breakdown.dat")
[ "$bad" = 0 ] && pass "capacity_breakdown.dat: each stack sums to its step time" || fail "capacity_breakdown.dat: $bad stacks off"
# the index: the ranked table (rank 1 = 64 GPUs' dps64 fsdp), the layouts that do not fit
# with their over GB (SQL), the run the charts came from
over=$(sqlite3 "$CAPDB" "SELECT printf('%.2f', over_bytes / 1e9) FROM predictions WHERE plan_run_id = 5
  AND NOT fits ORDER BY over_bytes LIMIT 1")
grep -q 'id="capacity_ranked"' "$CAPIDX" && grep -q '<tr><td>1</td><td>dps64</td><td>fsdp</td>' "$CAPIDX" &&
  grep -q '22 layouts fit, 2 do not' "$CAPIDX" && grep -q 'Layouts that do not fit' "$CAPIDX" &&
  grep -q "<td>$over</td>" "$CAPIDX" && grep -q 'on h100-sxm' "$CAPIDX" &&
  grep -q '<th>train days</th><th>GPU hours</th>' "$CAPIDX" &&
  grep -q "<td>$(sqlite3 "$CAPDB" "SELECT printf('%.4g', gpu_hours) FROM predictions WHERE plan_run_id = 5 AND rank = 1")</td>" "$CAPIDX" &&
  pass "capacity: the index's ranked table (with --tokens' GPU hours) and the layouts over capacity (over $over GB first)" ||
  fail "capacity: index tables"
# --run 1, a sweep run without results or plan runs: the index gives the reason
GNUPLOT=/nonexistent/gnuplot "$SB" report --db "$CAPDB" --out "$T/cap1" --scripts "$SCRIPTS" --run 1 >/dev/null 2>&1
grep -q 'Not drawn: run 1 has no plan_runs rows' "$T/cap1/index.html" && [ ! -e "$T/cap1/capacity_memory.png" ] &&
  pass "capacity --run 1: not drawn, the reason given" || fail "capacity --run 1"
if [ -z "${no_gnuplot:-}" ]; then
  wide=""
  for c in capacity_memory capacity_throughput capacity_breakdown; do
    [ -s "$T/cap/$c.png" ] && grep -q '<svg' "$T/cap/$c.svg" && grep -q "src=\"$c.png\"" "$CAPIDX" ||
      fail "capacity: $c not drawn or listed"
    w=$(png_w "$T/cap/$c.png")
    [ "$w" -le 1600 ] 2>/dev/null || wide="$wide $c=$w"
  done
  [ -z "$wide" ] && pass "capacity: the three charts drawn (png + svg), at most 1600 px wide" ||
    fail "capacity: wider than 1600 px:$wide"
  grep -q 'HBM capacity: h100-sxm, 80 GB' "$T/cap/capacity_memory.svg" && grep -q 'pp-fsdp' "$T/cap/capacity_memory.svg" &&
    pass "capacity_memory.svg: the capacity line and the plans in the key" || fail "capacity_memory.svg key"
  # the capacity charts by hand, with the index's line, from their .dat files only
  mkdir "$T/capbyhand"
  for c in capacity_memory capacity_throughput capacity_breakdown; do
    gnuplot -e "datadir='$T/cap/data'; outdir='$T/capbyhand'; fmt='png'" "$SCRIPTS/$c.gp" 2>"$T/gp.err" &&
      [ -s "$T/capbyhand/$c.png" ] || fail "$c.gp by hand: $(cat "$T/gp.err")"
  done
  grep -qF "gnuplot -e \"datadir='$T/cap/data'; outdir='$T/cap'; fmt='png'\" scripts/capacity_breakdown.gp" "$CAPIDX" &&
    pass "capacity charts redraw by hand with the index's line" || fail "capacity: the index's redraw line"
fi

# refusals: exit 2, one line on stderr, the file untouched, no output written
refuse() { # what file [more flags]
  what=$1; f=$2; shift 2
  cp "$f" "$T/before"
  "$SB" report --db "$f" --out "$T/refused" "$@" >/dev/null 2>"$T/err"
  rc=$?
  n=$(wc -l <"$T/err")
  if [ $rc -eq 2 ] && [ "$n" -eq 1 ] && cmp -s "$f" "$T/before" && [ ! -e "$T/refused" ]; then
    pass "$what refused: $(cat "$T/err")"
  else
    fail "$what: rc $rc, $n lines: $(cat "$T/err")"
  fi
}
printf 'this is not a database, just some text\n' >"$T/notadb.db"
refuse "non-DB file" "$T/notadb.db"
head -c 4096 /dev/zero | tr '\0' 'x' >"$T/junk.db"
refuse "4 KiB of junk" "$T/junk.db"
# the version after the one results/schema.sql states (SBVER, above): a newer program's DB
NEXTVER=$((SBVER + 1))
cp "$DB" "$T/vnext.db" && sqlite3 "$T/vnext.db" "UPDATE schema_version SET version = $NEXTVER;"
refuse "schema version $NEXTVER" "$T/vnext.db"
: >"$T/zero.db"
refuse "empty file" "$T/zero.db"
refuse "unknown run" "$DB" --run 99

# bad flags: exit 2, one line
badflag() {
  "$SB" report "$@" >/dev/null 2>"$T/err"
  rc=$?
  n=$(wc -l <"$T/err")
  [ $rc -eq 2 ] && [ "$n" -eq 1 ] && pass "refused: $*: $(cat "$T/err")" ||
    fail "flags '$*': rc $rc, $n lines"
}
badflag --bogus
badflag --db
badflag --format gif --db "$DB" --out "$T/bad"
badflag --format png,, --db "$DB" --out "$T/bad"
badflag --run yesterday --db "$DB" --out "$T/bad"
badflag --run 0 --db "$DB" --out "$T/bad"
badflag --scripts "$T" --db "$DB" --out "$T/bad"
badflag --db "$T/does-not-exist.db" --out "$T/bad"
badflag --db "$DB" --out "$T/bad" extra
[ -e "$T/does-not-exist.db" ] && fail "a missing --db was created"
[ -e "$T/bad" ] && fail "a refused report wrote its --out"
"$SB" report --help | grep -q 'usage: shardbench report' && pass "--help" || fail "--help"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
if [ -n "${no_gnuplot:-}" ]; then
  echo "SKIP: no gnuplot (scripts/install-deps installs it): the chart checks did not run"
  exit 77
fi
echo "all report checks passed"
exit 0
