# verify/harness-common.sh: what the shardbench end-to-end scripts share
# (harness.sh, fault.sh, badinput.sh), sourced after NAME is set:
#   SB, PLANS         the program (${top_builddir:-.}/bench/shardbench) and the plans
#   tmp               a fresh directory, removed on exit (made writable first, as a
#                     test may chmod parts of it); a script adds to it with on_exit
#   fail MSG          counts a failure and prints it
#   check NAME ACTUAL EXPECTED   one check: ACTUAL = EXPECTED
#   q DB SQL          sqlite3 query
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
finish() {
  echo "$NAME: $checks checks, $fails failed"
  [ "$fails" -eq 0 ] || exit 1
  [ "$checks" -gt 0 ] || { echo "$NAME: FAIL: ran no check"; exit 1; }
  exit 0
}
