# verify/harness-common.sh: what the shardbench end-to-end scripts share
# (harness.sh, fault.sh, badinput.sh), sourced after NAME is set:
#   SB, PLANS         the program (${top_builddir:-.}/bench/shardbench) and the plans
#   tmp               a fresh directory, removed on exit (made writable first, as a
#                     test may chmod parts of it); a script adds to it with on_exit
#   fail MSG          counts a failure and prints it
#   check NAME ACTUAL EXPECTED   one check: ACTUAL = EXPECTED
#   q DB SQL          sqlite3 query
#   refused NAME PATTERN CMD...  one check: CMD is bad input (exit 2, one stderr
#                     line matching PATTERN, nothing on stdout); $refused_rc is
#                     0 when it was, 1 when not
#   make_v3_db SRC DST  DST = the version 7 DB SRC taken back to schema version 3
#   make_v2_db SRC DST  DST = the version 7 DB SRC taken back to schema version 2
#   make_v1_db SRC DST  DST = the version 7 DB SRC taken back to schema version 1
#   finish            "NAME: N checks, N failed"; exit 1 on a failure or when no
#                     check ran, else 0
# It exits 99 when the program is not built and 77 (SKIP) without the sqlite3 CLI,
# which every one of these scripts needs (scripts/install-deps installs it).
# shellcheck shell=sh

SB="${top_builddir:-.}/bench/shardbench"
PLANS="${srcdir:-.}/plans"
if [ ! -x "$SB" ]; then
  echo "$NAME: $SB is not built" >&2
  exit 99
fi
if ! command -v sqlite3 >/dev/null 2>&1; then
  echo "SKIP: $NAME: the sqlite3 CLI is missing (scripts/install-deps installs it)"
  exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || exit 99
sb_on_exit=
on_exit() { sb_on_exit="$sb_on_exit $*;"; }
# shellcheck disable=SC2317 # called by the trap
sb_cleanup() {
  eval "$sb_on_exit"
  chmod -R u+w "$tmp" 2>/dev/null
  rm -rf "$tmp"
}
trap sb_cleanup EXIT INT TERM

fails=0
checks=0
fail() {
  fails=$((fails + 1))
  echo "FAIL: $*"
}
check() { # check NAME ACTUAL EXPECTED
  checks=$((checks + 1))
  if [ "$2" != "$3" ]; then fail "$1: got '$2', expected '$3'"; fi
}
q() { sqlite3 "$1" "$2"; }
refused_rc=0
refused() {
  name=$1
  pat=$2
  shift 2
  "$@" >"$tmp/o" 2>"$tmp/e"
  rc=$?
  checks=$((checks + 1))
  if [ $rc -ne 2 ] || [ "$(wc -l <"$tmp/e")" -ne 1 ] || [ -s "$tmp/o" ] ||
    ! grep -q -e "$pat" "$tmp/e"; then
    fail "$name: exit $rc, $(wc -l <"$tmp/e") stderr lines, stdout $(wc -c <"$tmp/o") bytes: $(head -c 300 "$tmp/e")"
    refused_rc=1
    return 1
  fi
  refused_rc=0
}
# Version 3 is version 7 less the pp tables, the planner's tables, grad_norm and the
# shape-only tables (version 7's shape_roles column with them), version 2 version 3
# less the split's columns, version 1 version 2 less three more (results/schema.sql's
# header lists each step's tables and columns).
make_v3_db() {
  cp "$1" "$2" &&
    sqlite3 "$2" "DROP TABLE pp_events; DROP TABLE pp_stats; DROP TABLE pp_stages;
      DROP TABLE predictions; DROP TABLE plan_runs; DROP TABLE hardware;
      DROP TABLE shape_comm; DROP TABLE shape_roles; DROP TABLE shape_runs;
      ALTER TABLE results DROP COLUMN grad_norm;
      UPDATE schema_version SET version = 3; PRAGMA journal_mode = delete;" >/dev/null
}
make_v2_db() {
  make_v3_db "$1" "$2" &&
    sqlite3 "$2" "ALTER TABLE results DROP COLUMN mem_params_bytes;
      ALTER TABLE results DROP COLUMN mem_grads_bytes; ALTER TABLE results DROP COLUMN mem_optimizer_bytes;
      ALTER TABLE results DROP COLUMN mem_activations_bytes; UPDATE schema_version SET version = 2;
      PRAGMA journal_mode = delete;" >/dev/null
}
make_v1_db() {
  make_v2_db "$1" "$2" &&
    sqlite3 "$2" "ALTER TABLE runs DROP COLUMN peak_tflops; ALTER TABLE runs DROP COLUMN peak_source;
      ALTER TABLE results DROP COLUMN worst; UPDATE schema_version SET version = 1;" >/dev/null
}
finish() {
  echo "$NAME: $checks checks, $fails failed"
  [ "$fails" -eq 0 ] || exit 1
  [ "$checks" -gt 0 ] || { echo "$NAME: FAIL: ran no check"; exit 1; }
  exit 0
}
