#!/bin/sh
# verify/meta-sweep.sh: `shardbench sweep --device meta` (every config a shape-only run,
# into shape_runs / shape_roles / shape_comm) against the same sweep run for real.
#   1. World 8, the debugmodel with 2 layers: every config of `sweep --world 8`
#      (every mesh shape x every shipped plan, workload model; one timed step, no
#      warm-up) on cuda-emu (device memory: the counters a GPU run has) and on meta.
#      verify/meta-sweep-compare.py compares the two DBs config by config: status,
#      rank 0's memory split and the peak exactly, rank 0's comm rows row for row, and
#      the linear layers' GEMM FLOPs against 2 N T / 4 N T (its header says how). The
#      oracle is the real run, and for the FLOPs the config alone.
#   2. World 32, all five dims (pp 2 x dp_replicate 2 x dp_shard 2 x cp 2 x tp 2,
#      plans/torchtitan-5d.plan) with --ac none, full and selective:op: the same.
#   3. Planted, each must fail the comparison: an extra all_reduce in the real run
#      (SHARDBENCH_FAULT=extra-all-reduce), one byte more in a real rank 0's
#      gradients (the DB edited), the analytic count for 3 layers.
#   4. The DB: shape-only runs never reach configs or results; each role's
#      shape_roles.reserved_peak_bytes is the reserved_peak_bytes of the same run's
#      --json output (read by python3, not by shardbench; planted: one byte off is
#      seen); a version 5 DB is upgraded to 7 by `run --device meta --db` and keeps
#      its rows; a version 6 DB (no reserved_peak_bytes) is refused by merge, then
#      upgraded to 7 by `run --device meta --db`: its old roles NULL, the new run's
#      filled, and merged so; merge carries the shape_* rows; --resume finds them;
#      bad input: --device meta with --backend mpi or --launcher.
# Not compared: the fqn of comm rows (the measured comm table has none; shape_comm
# keeps the ledger's scope) and the roles other than rank 0's (a measured run stores
# rank 0's split only; verify/test_meta.c compares every rank's ledgers and memory).
NAME=meta-sweep
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "$NAME: SKIP (no python3 to read the DBs)"; exit 77; }
CMP="${srcdir:-.}/verify/meta-sweep-compare.py"

# compared NAME WANT REAL META [ARGS]: the comparison exits WANT (0 agree, 1 differ)
compared() {
  label=$1 want=$2 real=$3 meta=$4
  shift 4
  python3 "$CMP" "$real" "$meta" "$@" >"$tmp/cmp.out" 2>&1
  rc=$?
  checks=$((checks + 1))
  if [ "$rc" -ne "$want" ]; then
    fail "$label: comparison exit $rc, expected $want:"
    head -n 12 "$tmp/cmp.out"
  fi
  echo "$NAME: $label: $(tail -n 1 "$tmp/cmp.out")"
}
S="--models debugmodel:n_layers=2 --workloads model --batch 8 --seq 16 --steps 1 --warmup 0"

# ---- 1. world 8: every config ------------------------------------------------------------
# shellcheck disable=SC2086
"$SB" sweep --world 8 $S --device cuda-emu --db "$tmp/r8.db" >"$tmp/r8.out" 2>"$tmp/r8.err"
check "world 8 real sweep: exit" "$?" 0
# shellcheck disable=SC2086
"$SB" sweep --world 8 $S --device meta --db "$tmp/m8.db" >"$tmp/m8.out" 2>"$tmp/m8.err"
check "world 8 meta sweep: exit" "$?" 0
n_ok=$(q "$tmp/r8.db" "SELECT count(*) FROM results WHERE status = 'ok'")
check "world 8: shape-only configs = the real sweep's ok ones" \
  "$(q "$tmp/m8.db" "SELECT count(*) FROM shape_runs WHERE status = 'shape-only'")" "$n_ok"
[ "$n_ok" -gt 40 ] || fail "world 8: only $n_ok configs ran for real"
compared "world 8, every config" 0 "$tmp/r8.db" "$tmp/m8.db"

# ---- 2. world 32: all five dims, with and without AC -------------------------------------
F="--world 32 --shapes pp:2,dp_replicate:2,dp_shard:2,cp:2,tp:2 --plans torchtitan-5d --ac none,full,selective:op"
# shellcheck disable=SC2086
"$SB" sweep $F $S --device cuda-emu --db "$tmp/r32.db" >"$tmp/r32.out" 2>"$tmp/r32.err"
check "world 32 real sweep: exit" "$?" 0
# shellcheck disable=SC2086
"$SB" sweep $F $S --device meta --db "$tmp/m32.db" >"$tmp/m32.out" 2>"$tmp/m32.err"
check "world 32 meta sweep: exit" "$?" 0
check "world 32: three shape-only configs, two roles each (the pp stages)" \
  "$(q "$tmp/m32.db" "SELECT count(*), group_concat(n_roles) FROM shape_runs WHERE status = 'shape-only'")" "3|2,2,2"
compared "world 32, 5-D, ac none/full/selective:op" 0 "$tmp/r32.db" "$tmp/m32.db"

# ---- 3. planted --------------------------------------------------------------------------
# shellcheck disable=SC2086
SHARDBENCH_FAULT=extra-all-reduce "$SB" sweep --world 8 $S --device cuda-emu --shapes dp_shard:4,tp:2 \
  --plans fsdp-tp-sp --db "$tmp/fault.db" >"$tmp/f.out" 2>"$tmp/f.err"
check "planted extra all_reduce: the real run still ok" \
  "$(q "$tmp/fault.db" "SELECT group_concat(status) FROM results")" ok
compared "planted: an extra all_reduce in the real run" 1 "$tmp/fault.db" "$tmp/m8.db" --subset
grep -q "comm rows differ" "$tmp/cmp.out" || fail "planted extra all_reduce: not seen as a comm row"
cp "$tmp/r8.db" "$tmp/mem.db"
q "$tmp/mem.db" "UPDATE results SET mem_grads_bytes = mem_grads_bytes + 1 WHERE id = (SELECT min(id) FROM results WHERE status = 'ok')"
compared "planted: one byte more in a real rank 0's gradients" 1 "$tmp/mem.db" "$tmp/m8.db"
grep -q "memory split" "$tmp/cmp.out" || fail "planted memory: not seen as the split"
compared "planted: the analytic FLOPs of 3 layers" 1 "$tmp/r8.db" "$tmp/m8.db" --layers 3

# ---- 4. the DB ---------------------------------------------------------------------------
check "meta DB: nothing in configs or results" \
  "$(q "$tmp/m8.db" "SELECT (SELECT count(*) FROM configs) + (SELECT count(*) FROM results)")" 0
check "meta DB: schema version 7" "$(q "$tmp/m8.db" "SELECT group_concat(version) FROM schema_version")" 7
check "meta DB: every shape-only role has its reserved peak" \
  "$(q "$tmp/m8.db" "SELECT count(*) FROM shape_roles WHERE reserved_peak_bytes IS NULL OR reserved_peak_bytes <= 0")" 0
# shellcheck disable=SC2086
"$SB" sweep --world 8 $S --device meta --db "$tmp/m8.db" --resume >"$tmp/res.out" 2>&1
check "meta sweep --resume: every config already there" \
  "$(sed -n 's/.*, \([0-9]*\) already in the DB.*/\1/p' "$tmp/res.out")" \
  "$(q "$tmp/m8.db" "SELECT count(*) FROM shape_runs")"
# a version 5 DB: this one without the shape tables, taken back to 5
cp "$tmp/r8.db" "$tmp/v5.db"
q "$tmp/v5.db" "DROP TABLE shape_comm; DROP TABLE shape_roles; DROP TABLE shape_runs;
  UPDATE schema_version SET version = 5; PRAGMA journal_mode = delete;" >/dev/null
nres=$(q "$tmp/v5.db" "SELECT count(*) FROM results")
"$SB" run --device meta --model debugmodel:n_layers=2 --batch 8 --seq 16 --dp-shard 4 --tp 2 \
  --plan fsdp-tp-sp --db "$tmp/v5.db" >/dev/null 2>"$tmp/v5.err"
check "v5 upgraded by run --device meta --db: exit" "$?" 0
check "v5 upgraded: version, results kept, one shape-only run with its rows" \
  "$(q "$tmp/v5.db" "SELECT (SELECT group_concat(version) FROM schema_version), (SELECT count(*) FROM results), (SELECT count(*) || ':' || group_concat(status) FROM shape_runs), (SELECT count(*) > 0 FROM shape_comm), (SELECT count(*) FROM shape_roles)")" \
  "7|$nres|1:shape-only|1|1"
# its shape_roles came from the CREATE TABLE, with the column: the 6 -> 7 step adds none
check "v5 upgraded: one reserved_peak_bytes column, filled" \
  "$(q "$tmp/v5.db" "SELECT (SELECT count(*) FROM pragma_table_info('shape_roles') WHERE name = 'reserved_peak_bytes'), (SELECT count(*) FROM shape_roles WHERE reserved_peak_bytes > 0)")" \
  "1|1"

# shape_roles.reserved_peak_bytes against the same run's JSON, role by role (first
# rank, value; the DB's NULL for a role without an allocator model, JSON 0). The
# uneven vocab makes 2 roles (513 and 511 rows) whose reserved peaks differ.
json_reserved() { # json_reserved JSON [DELTA]: DELTA added to each value (planted)
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1])); delta=int(sys.argv[2])
for r in d["roles"]: print("%d|%s" % (r["rank"], r["reserved_peak_bytes"] + delta if r["reserved_peak_bytes"] > 0 else ""))' "$1" "${2:-0}"
}
db_reserved() { # db_reserved DB SHAPE_RUN_ID
  q "$1" "SELECT first_rank || '|' || ifnull(reserved_peak_bytes, '') FROM shape_roles WHERE shape_run_id = $2 ORDER BY role"
}
# every role of a DB: key, role, reserved peak (NULL spelled out)
RESERVED="SELECT s.key || '|' || r.role || '|' || ifnull(r.reserved_peak_bytes, 'NULL') FROM shape_roles r JOIN shape_runs s ON s.id = r.shape_run_id ORDER BY 1"
U="--device meta --model debugmodel:n_layers=1:vocab=2050 --batch 4 --seq 16 --dp-shard 4 --plan fsdp"
# shellcheck disable=SC2086
"$SB" run $U --json --db "$tmp/u.db" >"$tmp/u.json" 2>"$tmp/u.err"
check "reserved: run --json --db exit" "$?" 0
check "reserved: 2 roles, not alike" \
  "$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); v=[r["reserved_peak_bytes"] for r in d["roles"]]; print(len(v), min(v) > 0, len(set(v)) > 1)' "$tmp/u.json")" \
  "2 True True"
check "reserved: shape_roles = the JSON's reserved_peak_bytes" "$(db_reserved "$tmp/u.db" 1)" \
  "$(json_reserved "$tmp/u.json")"
# planted: the JSON's values one byte more must not compare equal
checks=$((checks + 1))
[ "$(db_reserved "$tmp/u.db" 1)" = "$(json_reserved "$tmp/u.json" 1)" ] &&
  fail "planted: reserved peaks one byte off compared equal"
# a version 6 DB: this one without the column, taken back to 6
cp "$tmp/u.db" "$tmp/v6.db"
q "$tmp/v6.db" "ALTER TABLE shape_roles DROP COLUMN reserved_peak_bytes;
  UPDATE schema_version SET version = 6; PRAGMA journal_mode = delete;" >/dev/null
check "v6 DB: version 6, no reserved_peak_bytes, 2 roles" \
  "$(q "$tmp/v6.db" "SELECT (SELECT group_concat(version) FROM schema_version), (SELECT count(*) FROM pragma_table_info('shape_roles') WHERE name = 'reserved_peak_bytes'), (SELECT count(*) FROM shape_roles)")" \
  "6|0|2"
before=$(cksum <"$tmp/v6.db")
refused "merge: a version 6 input" "schema version 6, this shardbench merges only version 7" \
  "$SB" merge "$tmp/out6.db" "$tmp/v6.db"
check "merge: the version 6 input untouched" "$(cksum <"$tmp/v6.db")" "$before"
checks=$((checks + 1))
[ -e "$tmp/out6.db" ] && fail "merge: a version 6 input: OUT was created"
"$SB" run --device meta --model debugmodel:n_layers=2 --batch 8 --seq 16 --dp-shard 4 --tp 2 \
  --plan fsdp-tp-sp --json --db "$tmp/v6.db" >"$tmp/v6.json" 2>"$tmp/v6.err"
check "v6 upgraded by run --device meta --db: exit" "$?" 0
check "v6 upgraded: version, the old run's 2 roles NULL, the new run's 1 filled" \
  "$(q "$tmp/v6.db" "SELECT (SELECT group_concat(version) FROM schema_version), (SELECT count(*) FROM shape_roles WHERE shape_run_id = 1 AND reserved_peak_bytes IS NULL), (SELECT count(*) FROM shape_roles WHERE shape_run_id = 2 AND reserved_peak_bytes > 0), (SELECT count(*) FROM shape_roles)")" \
  "7|2|1|3"
check "v6 upgraded: the new run's shape_roles = its JSON's reserved_peak_bytes" \
  "$(db_reserved "$tmp/v6.db" 2)" "$(json_reserved "$tmp/v6.json")"
"$SB" merge "$tmp/out6.db" "$tmp/v6.db" >/dev/null 2>"$tmp/merge6.err"
check "merge: the upgraded version 6 DB: exit" "$?" 0
check "merge: the upgraded DB's reserved peaks carried (NULL stays NULL)" \
  "$(q "$tmp/out6.db" "$RESERVED")" \
  "$(q "$tmp/v6.db" "$RESERVED")"
"$SB" merge "$tmp/out.db" "$tmp/r8.db" "$tmp/m8.db" >/dev/null 2>"$tmp/merge.err"
check "merge: exit" "$?" 0
check "merge: results and shape-only rows carried" \
  "$(q "$tmp/out.db" "SELECT (SELECT count(*) FROM results), (SELECT count(*) FROM shape_runs), (SELECT count(*) FROM shape_roles), (SELECT count(*) FROM shape_comm)")" \
  "$(q "$tmp/r8.db" "SELECT count(*) FROM results")|$(q "$tmp/m8.db" "SELECT (SELECT count(*) FROM shape_runs), (SELECT count(*) FROM shape_roles), (SELECT count(*) FROM shape_comm)")"
compared "merged DB against the real one" 0 "$tmp/r8.db" "$tmp/out.db"
check "merge: every role's reserved peak carried" "$(q "$tmp/out.db" "$RESERVED")" "$(q "$tmp/m8.db" "$RESERVED")"
refused "sweep --device meta --backend mpi" "^shardbench sweep: --\(device\|backend\): " \
  "$SB" sweep --world 8 --device meta --backend mpi --db "$tmp/no.db"
refused "sweep --device meta --launcher" "^shardbench sweep: --\(device\|backend\): " \
  "$SB" sweep --world 8 --device meta --launcher 'mpirun -np {world}' --db "$tmp/no.db"
[ -e "$tmp/no.db" ] && fail "refused meta sweeps: the DB was created"
finish
