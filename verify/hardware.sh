#!/bin/sh
# verify/hardware.sh: bench/calibrate-local.sh end to end (quick mode, a few seconds).
#   1. It writes a hardware file that verify/test_hardware loads and scans (every
#      numeric key cited) and whose every numeric line cites a measurement, an
#      assumption or a source file.
#   2. Its numbers against what they claim: hbm_gib = MemTotal of /proc/meminfo
#      in GiB (computed here), the GEMM table's best point is 1 (the peak is the
#      best rate of the sweep), intra_lat_us + coll_base_lat_us > 0 (a collective
#      costs something), inter = intra (one host).
#   3. Planted: the same file with one citation removed is refused, naming its line.
#   4. Bad input: no programs (SB_BIN pointing nowhere): exit 2, one line.
NAME=hardware
B="${top_builddir:-.}"
S="${srcdir:-.}"
T="$B/verify/test_hardware"
[ -x "$T" ] || { echo "$NAME: $T is not built" >&2; exit 99; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT INT TERM
fails=0 checks=0
fail() { fails=$((fails + 1)); echo "FAIL: $*"; }
check() { checks=$((checks + 1)); [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"; }

# 1. a quick calibration that loads
SB_CAL_QUICK=1 SB_BIN="$B/bench" sh "$S/bench/calibrate-local.sh" "$tmp/local" >"$tmp/out" 2>"$tmp/err"
check "calibrate-local exit" "$?" 0
[ -s "$tmp/local" ] || { fail "no file written: $(head -c 300 "$tmp/err")"; echo "$NAME: $checks checks, $fails failed"; exit 1; }
"$T" "$tmp/local" >"$tmp/t.out" 2>&1
check "test_hardware loads the calibrated file" "$?" 0
[ "$fails" -eq 0 ] || tail -5 "$tmp/t.out"
# every numeric line (not a comment, description or source.) cites measured / calibrated / assumption / a file
uncited=$(grep -v '^#\|^description\|^source\.\|^ *$' "$tmp/local" |
  grep -v '# measured: \|# assumption\|# calibrated: \|# lib/' | head -1)
check "every numeric line cites how it was got" "$uncited" ""

# 2. the numbers against their claims
val() { sed -n "s/^$1 = \([^ ]*\).*/\1/p" "$tmp/local"; }
check "hbm_gib = MemTotal in GiB" "$(val hbm_gib)" \
  "$(awk '/^MemTotal:/ {printf "%.2f", $2 / 1048576}' /proc/meminfo)"
best=$(sed -n 's/^gemm_f32 = \([^#]*\)#.*/\1/p' "$tmp/local" | tr ' ' '\n' | grep . | awk -F: '{ if ($2 > m) m = $2 } END { printf "%.3f", m }')
check "the GEMM table's best point is the peak" "$best" "1.000"
check "the collective costs something" \
  "$(awk -v a="$(val intra_lat_us)" -v b="$(val coll_base_lat_us)" 'BEGIN { print (a + b > 0) }')" 1
check "inter_gbps = intra_gbps" "$(val inter_gbps)" "$(val intra_gbps)"
check "inter_lat_us = intra_lat_us" "$(val inter_lat_us)" "$(val intra_lat_us)"

# 3. planted: drop the citation of hbm_gbps
sed 's/^\(hbm_gbps = [^ ]*\).*/\1/' "$tmp/local" >"$tmp/planted"
line=$(grep -n '^hbm_gbps = ' "$tmp/planted" | cut -d: -f1)
"$T" "$tmp/planted" >"$tmp/p.out" 2>&1
check "an uncited number is refused" "$?" 1
grep -q "$tmp/planted:$line: 'hbm_gbps' has no source" "$tmp/p.out" ||
  fail "the refusal does not name line $line: $(grep planted "$tmp/p.out" | head -2)"
checks=$((checks + 1))

# 4. no programs
SB_BIN="$tmp/none" sh "$S/bench/calibrate-local.sh" "$tmp/x" >"$tmp/o" 2>"$tmp/e"
check "no programs: exit" "$?" 2
check "no programs: one line" "$(wc -l <"$tmp/e" | tr -d ' ')" 1
check "no programs: nothing written" "$([ -e "$tmp/x" ] && echo yes || echo no)" no

echo "$NAME: $checks checks, $fails failed"
[ "$checks" -gt 0 ] && [ "$fails" -eq 0 ]
