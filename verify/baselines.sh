#!/bin/sh
# verify/baselines.sh: `shardbench baselines` end to end: the Megatron TP numbers
# for Llama 3 8B on tp 8 against a hand computation (baselines.md 1.1), the PP
# bubble for pp 4, m 8 (3/11, baselines.md 3), JSON that parses (python3 when
# present), one-line exit-2 errors for bad flags, and --db rows (sqlite3 CLI
# when present). Exit 0 pass, 1 fail, 77 skip (Automake).
set -u
SB="${top_builddir:-.}/bench/shardbench"
SRC="${srcdir:-.}"
[ -x "$SB" ] || { echo "baselines.sh: no $SB"; exit 77; }
TMP="${TMPDIR:-/tmp}/sb-baselines.$$"
mkdir -p "$TMP" || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 8B: h 4096, L 32, V 128256; batch 8, seq 8192, bf16 (2 B), tp 8.
"$SB" baselines --model 8B --tp 8 --batch 8 --seq 8192 --dtype bf16 > "$TMP/8b.txt" 2> "$TMP/err" \
  || fail "8B tp 8 exited $?: $(cat "$TMP/err")"
get() { awk -v f="$1" -v q="$2" '$1 == f && $2 == q { print $3; exit }' "$TMP/$3"; }
# per layer: 4 AR of b*s*h: 8*b*s*h*(t-1)/t * 2 bytes
want=$(awk 'BEGIN { printf "%.0f", 8 * 8 * 8192 * 4096 * 7 / 8 * 2 }')
got=$(get megatron-tp comm_bytes_per_layer 8b.txt)
[ "$got" = "$want" ] || fail "megatron-tp comm_bytes_per_layer: got '$got', want $want"
got=$(get megatron-tp-sp comm_bytes_per_layer 8b.txt)
[ "$got" = "$want" ] || fail "megatron-tp-sp comm_bytes_per_layer: got '$got', want $want"
# whole step, Megatron TP (no loss parallel): (4L+2) AR of bsh + AG of b*s*V logits
want=$(awk 'BEGIN { b = 8; s = 8192; h = 4096; V = 128256; L = 32; t = 8; e = 2;
  printf "%.0f", (4 * L + 2) * 2 * (t - 1) / t * b * s * h * e + (t - 1) / t * b * s * V * e }')
got=$(get megatron-tp comm_bytes_per_step 8b.txt)
[ "$got" = "$want" ] || fail "megatron-tp comm_bytes_per_step: got '$got', want $want"
echo "8B tp 8: megatron-tp per step $got bytes (hand: $want)"

# PP bubble: pp 4, m 8 -> (p-1)/(m+p-1) = 3/11 for GPipe and 1F1B
"$SB" baselines --model 8B --mesh pp:4,tp:2 --batch 8 --seq 1024 --microbatches 8 --json \
  > "$TMP/pp.json" 2> "$TMP/err" || fail "pp 4 exited $?: $(cat "$TMP/err")"
"$SB" baselines --model 8B --pp 4 --tp 2 --batch 8 --seq 1024 --microbatches 8 > "$TMP/pp.txt" \
  2> "$TMP/err" || fail "pp 4 (text) exited $?"
for fw in gpipe 1f1b; do
  got=$(get $fw bubble_fraction pp.txt)
  ok=$(awk -v g="$got" 'BEGIN { d = g - 3 / 11; print (d < 1e-9 && d > -1e-9) ? 1 : 0 }')
  [ "$ok" = 1 ] || fail "$fw bubble_fraction: got '$got', want 3/11"
done
if command -v python3 > /dev/null 2>&1; then
  python3 - "$TMP/pp.json" <<'PY' || fail "JSON does not parse or has wrong values"
import json, sys
d = json.load(open(sys.argv[1]))
rows = {(r["framework"], r["quantity"]): r["value"] for r in d["baselines"]}
assert abs(rows[("gpipe", "bubble_fraction")] - 3 / 11) < 1e-12
assert abs(rows[("1f1b", "bubble_fraction")] - 3 / 11) < 1e-12
assert d["mesh"]["pp"] == 4 and d["mesh"]["tp"] == 2
assert all(r["formula"] for r in d["baselines"])
PY
else
  echo "baselines.sh: no python3: JSON parse check skipped"
fi

# bad flags: exit 2 with exactly one line on stderr, nothing on stdout
bad() {
  "$SB" baselines "$@" > "$TMP/out" 2> "$TMP/err"
  rc=$?
  n=$(wc -l < "$TMP/err")
  [ "$rc" = 2 ] && [ "$n" = 1 ] && [ ! -s "$TMP/out" ] \
    || fail "baselines $*: rc $rc, $n stderr lines: $(cat "$TMP/err")"
}
bad --model 8B --tp 8 --batch 8
bad --model 9B --tp 8 --batch 8 --seq 8
bad --model 8B --tp 0 --batch 8 --seq 8
bad --model 8B --mesh tp:8,xp:2 --batch 8 --seq 8
bad --model 8B --mesh tp:8 --tp 4 --batch 8 --seq 8
bad --model 8B --dp-shard 3 --batch 8 --seq 8
bad --model 8B --batch 8 --seq 8 --dtype f16
bad --model 8B --batch 8 --seq 8 --bogus
bad --model 8B --batch 8 --seq 8 --json=1
bad --model 8B --batch 8 --seq 8 --plan x

# --db: rows in baselines and published (idempotent), linked to a configs row with --plan
if command -v sqlite3 > /dev/null 2>&1; then
  DB="$TMP/r.db"
  for i in 1 2; do
    "$SB" baselines --model debugmodel --mesh dp_replicate:2,tp:4 --batch 8 --seq 64 --dtype f32 \
      --db "$DB" --plan torchtitan-tp-sp --workload block --steps 3 \
      --published "$SRC/results/published.csv" > /dev/null \
      2> "$TMP/err" || fail "--db run $i exited $?: $(cat "$TMP/err")"
  done
  "$SB" baselines --model 8B --tp 8 --batch 8 --seq 8192 --db "$DB" \
    --published "$SRC/results/published.csv" > "$TMP/8b2.txt" \
    2> "$TMP/err" || fail "--db (no plan) exited $?: $(cat "$TMP/err")"
  nrows=$(awk 'f { n++ } /^framework +quantity/ { f = 1 } END { print n + 0 }' "$TMP/8b2.txt")
  key='model=debugmodel workload=block plan=torchtitan-tp-sp mesh=dp_replicate:2,tp:4 dtype=f32 batch=8 seq=64 steps=3 backend=threads world=8'
  nlinked=$(sqlite3 "$DB" "SELECT count(*) FROM baselines b JOIN configs c ON b.config_id = c.id WHERE c.key = '$key'")
  nnull=$(sqlite3 "$DB" "SELECT count(*) FROM baselines WHERE config_id IS NULL")
  npub=$(sqlite3 "$DB" "SELECT count(*) FROM published")
  ncsv=$(($(wc -l < "$SRC/results/published.csv") - 1))
  [ "$nlinked" = "$nrows" ] || fail "--db: $nlinked rows linked to the config, want $nrows (written twice: replaced)"
  [ "$nnull" = "$nrows" ] || fail "--db: $nnull rows with config_id NULL, want $nrows"
  [ "$npub" = "$ncsv" ] || fail "--db: published has $npub rows, the CSV $ncsv (loaded 3 times)"
  echo "--db: $nlinked linked + $nnull unlinked baselines rows, $npub published rows"
else
  echo "baselines.sh: no sqlite3: --db check skipped"
fi

[ "$fails" = 0 ] || { echo "baselines.sh: $fails failure(s)"; exit 1; }
echo "baselines.sh: all checks passed"
