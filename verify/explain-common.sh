# verify/explain-common.sh: sourced by explain.sh and explain-op.sh (set NAME
# first): the program, a temporary directory, and the checks they share.
#
#   ok CASE [-e PATTERN]... [-r REGEX]... [-n COUNT]... -- ARGS...
#     exit 0, no "MISMATCH", a "full_tensor: match" line (text) or
#     '"match": true}' (--json), every fixed string (-e) / extended regular
#     expression (-r) in stdout, and (-n) exactly COUNT "full_tensor: match"
#     lines;
#   bad CASE FLAG ARGS...
#     exit 2, nothing on stdout, exactly one line on stderr, starting with
#     "shardbench" and naming FLAG;
#   fail CASE WHY ARGS...: counts a failure and prints the command (pasteable)
#     with its stdout (first 80 lines) and stderr.
#   have TOOL CASE: true when TOOL runs here; otherwise records CASE as not
#     run (the caller then skips that check and finish says so).
#   finish: prints the counts and exits: 1 on a failure or when no check ran,
#     77 (SKIP) when a check could not run for want of a tool, 0 only when
#     every check ran and passed.
# $checks and $fails count.

SB="${top_builddir:-.}/bench/shardbench"
if [ ! -x "$SB" ]; then
  echo "$NAME: $SB is not built" >&2
  exit 99 # Automake: a hard error, not a failure of the thing tested
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
OUT="$tmp/out"
ERR="$tmp/err"
fails=0
checks=0
missing=""
# The interpreter of the JSON checks; scripts/install-deps installs python3.
PYTHON3=${PYTHON3:-python3}

# Quotes each argument for the failure report, so it can be pasted into a shell.
show_cmd() {
  printf '  ran:'
  printf ' %s' "$SB"
  for a in "$@"; do printf " '%s'" "$a"; done
  printf '\n'
}

fail() {
  name=$1
  why=$2
  shift 2
  fails=$((fails + 1))
  echo "FAIL: $name: $why"
  show_cmd "$@"
  echo "  --- stdout (first 80 lines) ---"
  sed -n '1,80p' "$OUT"
  echo "  --- stderr ---"
  cat "$ERR"
}

ok() {
  name=$1
  shift
  pats=$tmp/pats
  : >"$pats"
  while [ "$1" != "--" ]; do
    printf '%s\t%s\n' "$1" "$2" >>"$pats"
    shift 2
  done
  shift
  checks=$((checks + 1))
  "$SB" "$@" >"$OUT" 2>"$ERR"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$name" "exit code $rc, expected 0" "$@"
    return
  fi
  case " $* " in
    *" --json "*) want='"match": true}' ;;
    *) want='full_tensor: match' ;;
  esac
  if ! grep -F -q -- "$want" "$OUT"; then
    fail "$name" "no '$want' in stdout" "$@"
    return
  fi
  if grep -F -q MISMATCH "$OUT"; then
    fail "$name" "MISMATCH in stdout" "$@"
    return
  fi
  while IFS='	' read -r kind pat; do
    case $kind in
      -e) grep -F -q -- "$pat" "$OUT" || { fail "$name" "no '$pat' in stdout" "$@"; return; } ;;
      -r) grep -E -q -- "$pat" "$OUT" ||
            { fail "$name" "no line matching /$pat/ in stdout" "$@"; return; } ;;
      -n) n=$(grep -c 'full_tensor: match' "$OUT")
          [ "$n" -eq "$pat" ] ||
            { fail "$name" "$n 'full_tensor: match' lines, expected $pat" "$@"; return; } ;;
    esac
  done <"$pats"
}

bad() {
  name=$1
  flag=$2
  shift 2
  checks=$((checks + 1))
  "$SB" "$@" >"$OUT" 2>"$ERR"
  rc=$?
  if [ $rc -ne 2 ]; then
    fail "$name" "exit code $rc, expected 2" "$@"
    return
  fi
  if [ -s "$OUT" ]; then
    fail "$name" "wrote to stdout on bad input" "$@"
    return
  fi
  lines=$(wc -l <"$ERR")
  if [ "$lines" -ne 1 ]; then
    fail "$name" "$lines lines on stderr, expected 1" "$@"
    return
  fi
  if ! grep -q '^shardbench' "$ERR" || ! grep -F -q -- "$flag" "$ERR"; then
    fail "$name" "stderr does not start with 'shardbench' and name '$flag'" "$@"
    return
  fi
}

have() {
  if command -v "$1" >/dev/null 2>&1; then return 0; fi
  missing="$missing $2 (needs $1)"
  return 1
}

finish() {
  echo "$NAME: $checks checks, $fails failed"
  if [ "$fails" -ne 0 ]; then exit 1; fi
  if [ "$checks" -eq 0 ]; then
    echo "FAIL: $NAME: ran no check"
    exit 1
  fi
  if [ -n "$missing" ]; then
    echo "SKIP: $NAME: not run:$missing; scripts/install-deps installs the tools"
    exit 77
  fi
  exit 0
}
