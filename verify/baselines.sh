#!/bin/sh
# verify/baselines.sh: `shardbench baselines` end to end:
# - Megatron-LM TP and TP + sequence parallel for Llama 3 8B on tp 8 against a
#   hand computation of the papers' formulas (arXiv:1909.08053 sec. 3:
#   4 all-reduces of b*s*h per layer + the embedding's; arXiv:2205.05198
#   sec. 4.2.2: 3 all-gathers + 2 reduce-scatters per split block);
# - the PP bubble for pp 4, m 8 (3/11; arXiv:1811.06965, arXiv:2104.04473);
# - JSON that parses, read back with sqlite3's JSON functions;
# - one-line exit-2 errors for bad flags;
# - --plan: the framework selected from the plan's settings, the same for a plan
#   copied under another name (and under another plan's name), by
#   `shardbench baselines --plan` and by the store of `shardbench run --db`;
# - --db rows (baselines linked to a configs row, published loaded once).
# Needs the sqlite3 CLI (scripts/install-deps installs it): without it the
# script runs nothing and exits 77 (SKIP). Exit 0 pass, 1 fail (Automake).
set -u
SB="${top_builddir:-.}/bench/shardbench"
SRC="${srcdir:-.}"
[ -x "$SB" ] || { echo "baselines.sh: no $SB"; exit 99; }
command -v sqlite3 > /dev/null 2>&1 || {
  echo "SKIP: baselines.sh needs the sqlite3 CLI (scripts/install-deps)"
  exit 77
}
TMP="${TMPDIR:-/tmp}/sb-baselines.$$"
mkdir -p "$TMP" || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 8B: h 4096, L 32, V 128256; batch 8, seq 8192, bf16 (2 B), tp 8.
"$SB" baselines --model 8B --tp 8 --batch 8 --seq 8192 --dtype bf16 > "$TMP/8b.txt" 2> "$TMP/err" \
  || fail "8B tp 8 exited $?: $(cat "$TMP/err")"
get() { awk -v f="$1" -v q="$2" '$1 == f && $2 == q { print $3; exit }' "$TMP/$3"; }
want() { awk "BEGIN { b = 8; s = 8192; h = 4096; V = 128256; L = 32; t = 8; e = 2; printf \"%.0f\", $1 }"; }
# per layer, both: 4 AR of b*s*h = 8*b*s*h*(t-1)/t * 2 bytes
w=$(want '8 * b * s * h * (t - 1) / t * e')
got=$(get megatron-tp comm_bytes_per_layer 8b.txt)
[ "$got" = "$w" ] || fail "megatron-tp comm_bytes_per_layer: got '$got', want $w"
got=$(get megatron-tp-sp comm_bytes_per_layer 8b.txt)
[ "$got" = "$w" ] || fail "megatron-tp-sp comm_bytes_per_layer: got '$got', want $w"
# whole step, Megatron-LM TP: (4L + 1) AR of bsh (the +1: the embedding's); the output
# is fused with the cross-entropy, whose scalars the paper does not count
w=$(want '(4 * L + 1) * 2 * (t - 1) / t * b * s * h * e')
got=$(get megatron-tp comm_bytes_per_step 8b.txt)
[ "$got" = "$w" ] || fail "megatron-tp comm_bytes_per_step: got '$got', want $w"
echo "8B tp 8: megatron-tp per step $got bytes (hand: $w)"
# TP + SP: per layer 2 blocks x (3 AG + 2 RS) of bsh, + the embedding's AR bytes
w=$(want '(10 * L + 2) * (t - 1) / t * b * s * h * e')
got=$(get megatron-tp-sp comm_bytes_per_step 8b.txt)
[ "$got" = "$w" ] || fail "megatron-tp-sp comm_bytes_per_step: got '$got', want $w"
echo "8B tp 8: megatron-tp-sp per step $got bytes (hand: $w)"
# the unfused output's logits all-gather: b*s*V*(t-1)/t * e
w=$(want 'b * s * V * (t - 1) / t * e')
got=$(get megatron-tp comm_bytes_logits_unfused 8b.txt)
[ "$got" = "$w" ] || fail "megatron-tp comm_bytes_logits_unfused: got '$got', want $w"

# PP bubble: pp 4, m 8 -> (p-1)/(m+p-1) = 3/11 for GPipe and 1F1B
"$SB" baselines --model 8B --mesh pp:4,tp:2 --batch 8 --seq 1024 --microbatches 8 --json \
  > "$TMP/pp.json" 2> "$TMP/err" || fail "pp 4 exited $?: $(cat "$TMP/err")"
"$SB" baselines --model 8B --pp 4 --tp 2 --batch 8 --seq 1024 --microbatches 8 > "$TMP/pp.txt" \
  2> "$TMP/err" || fail "pp 4 (text) exited $?"
for fw in gpipe 1f1b; do
  got=$(get $fw bubble_fraction pp.txt)
  # the text prints %22.15g: 15 significant digits of 0.2727..., off by <= 5e-16
  ok=$(awk -v g="$got" 'BEGIN { d = g - 3 / 11; print (d < 1e-14 && d > -1e-14) ? 1 : 0 }')
  [ "$ok" = 1 ] || fail "$fw bubble_fraction: got '$got', want 3/11"
done
# the JSON, read back by sqlite3's JSON functions
J="$TMP/pp.json"
jq1() { sqlite3 :memory: "$1"; }
[ "$(jq1 "SELECT json_valid(readfile('$J'))")" = 1 ] || fail "JSON does not parse"
# the JSON prints %.17g: the double itself, within an ulp (5.6e-17) of 3/11
for fw in gpipe 1f1b; do
  ok=$(jq1 "SELECT abs(json_extract(value, '\$.value') - 3.0 / 11) < 1e-15 FROM json_each(readfile('$J'), '\$.baselines') WHERE json_extract(value, '\$.framework') = '$fw' AND json_extract(value, '\$.quantity') = 'bubble_fraction'")
  [ "$ok" = 1 ] || fail "JSON $fw bubble_fraction: '$ok'"
done
[ "$(jq1 "SELECT json_extract(readfile('$J'), '\$.mesh.pp') || ',' || json_extract(readfile('$J'), '\$.mesh.tp')")" = "4,2" ] \
  || fail "JSON mesh"
[ "$(jq1 "SELECT count(*) FROM json_each(readfile('$J'), '\$.baselines') WHERE coalesce(json_extract(value, '\$.formula'), '') = ''")" = 0 ] \
  || fail "JSON rows without a formula"

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
bad --model 8B --batch 8 --seq 8 --plan no-such-plan --plans-dir "$SRC/plans"
bad --model 8B --batch 8 --seq 8 --workload block
bad --model 8B --batch 8 --seq 8 --steps 2

# --plan: the framework follows the plan's settings, not its name. Copies of the
# shipped plans under other names, two of them under each other's names.
P="$TMP/plans"
mkdir -p "$P"
sed 's/^name = .*/name = renamed-sp/' "$SRC/plans/torchtitan-tp-sp.plan" > "$P/renamed-sp.plan"
sed 's/^name = .*/name = torchtitan-tp-sp/' "$SRC/plans/megatron-tp.plan" > "$P/torchtitan-tp-sp.plan"
sed 's/^name = .*/name = megatron-tp/' "$SRC/plans/torchtitan-tp-sp.plan" > "$P/megatron-tp.plan"
selects() { # plan dir -> "framework total" from --json
  "$SB" baselines --model debugmodel --mesh dp_replicate:2,tp:4 --batch 8 --seq 64 --dtype f32 \
    --plan "$1" --plans-dir "$2" --workload block --json > "$TMP/sel.json" 2> "$TMP/err" \
    || { echo "exit $?: $(cat "$TMP/err")"; return; }
  sqlite3 :memory: "SELECT json_extract(readfile('$TMP/sel.json'), '\$.plan.framework') || ' ' || CAST(json_extract(readfile('$TMP/sel.json'), '\$.plan.comm_bytes_per_step_combined') AS INTEGER)"
}
sp=$(selects torchtitan-tp-sp "$SRC/plans")
mg=$(selects megatron-tp "$SRC/plans")
case "$sp" in "megatron-tp-sp+ddp "*) ;; *) fail "torchtitan-tp-sp selects '$sp'" ;; esac
case "$mg" in "megatron-tp+ddp "*) ;; *) fail "megatron-tp selects '$mg'" ;; esac
[ "$(selects renamed-sp "$P")" = "$sp" ] || fail "renamed-sp (a copy of torchtitan-tp-sp) selects '$(selects renamed-sp "$P")', want '$sp'"
[ "$(selects torchtitan-tp-sp "$P")" = "$mg" ] || fail "megatron-tp named torchtitan-tp-sp selects '$(selects torchtitan-tp-sp "$P")', want '$mg'"
[ "$(selects megatron-tp "$P")" = "$sp" ] || fail "torchtitan-tp-sp named megatron-tp selects '$(selects megatron-tp "$P")', want '$sp'"
echo "--plan: torchtitan-tp-sp and its copies -> $sp; megatron-tp and its copy -> $mg"
# a plan with a typo: exit 2, one line naming the file and line
printf 'dims = tp:-1\n[tp]\noutput = ColwiseParalel()\n' > "$P/typo.plan"
bad --model debugmodel --tp 4 --batch 8 --seq 64 --plan typo --plans-dir "$P"
grep -q "typo.plan:3" "$TMP/err" || fail "--plan typo: the error does not name typo.plan:3: $(cat "$TMP/err")"
# the same through the store: `shardbench run --db` with the swapped names
RDB="$TMP/run.db"
for pl in torchtitan-tp-sp megatron-tp; do
  for dir in "$SRC/plans" "$P"; do
    "$SB" run --model debugmodel --workload block --plan $pl --plans-dir "$dir" --tp 4 \
      --batch 4 --seq 8 --steps 1 --warmup 0 --dtype f64 --db "$RDB" > /dev/null 2> "$TMP/err" \
      || fail "run $pl from $dir exited $?: $(cat "$TMP/err")"
    sqlite3 "$RDB" "SELECT b.framework FROM baselines b JOIN configs c ON c.id = b.config_id WHERE c.plan = '$pl' AND b.quantity = 'comm_bytes_per_step_combined'" >> "$TMP/$pl.fw"
  done
done
[ "$(tr '\n' ' ' < "$TMP/torchtitan-tp-sp.fw")" = "megatron-tp-sp megatron-tp " ] \
  || fail "store: plan named torchtitan-tp-sp (shipped, then megatron-tp's settings) -> $(tr '\n' ' ' < "$TMP/torchtitan-tp-sp.fw")"
[ "$(tr '\n' ' ' < "$TMP/megatron-tp.fw")" = "megatron-tp megatron-tp-sp " ] \
  || fail "store: plan named megatron-tp (shipped, then torchtitan-tp-sp's settings) -> $(tr '\n' ' ' < "$TMP/megatron-tp.fw")"

# --db: rows in baselines and published (idempotent), linked to a configs row with --plan
DB="$TMP/r.db"
for i in 1 2; do
  "$SB" baselines --model debugmodel --mesh dp_replicate:2,tp:4 --batch 8 --seq 64 --dtype f32 \
    --db "$DB" --plan torchtitan-tp-sp --plans-dir "$SRC/plans" --workload block --steps 3 \
    --published "$SRC/results/published.csv" > "$TMP/db$i.txt" \
    2> "$TMP/err" || fail "--db run $i exited $?: $(cat "$TMP/err")"
done
"$SB" baselines --model 8B --tp 8 --batch 8 --seq 8192 --db "$DB" \
  --published "$SRC/results/published.csv" > "$TMP/8b2.txt" \
  2> "$TMP/err" || fail "--db (no plan) exited $?: $(cat "$TMP/err")"
rows() { awk 'f { n++ } /^framework +quantity/ { f = 1 } END { print n + 0 }' "$1"; }
nplan=$(rows "$TMP/db2.txt")
nrows=$(rows "$TMP/8b2.txt")
key='model=debugmodel workload=block plan=torchtitan-tp-sp mesh=dp_replicate:2,tp:4 dtype=f32 batch=8 seq=64 steps=3 backend=threads world=8'
nlinked=$(sqlite3 "$DB" "SELECT count(*) FROM baselines b JOIN configs c ON b.config_id = c.id WHERE c.key = '$key'")
ncross=$(sqlite3 "$DB" "SELECT count(*) FROM baselines b JOIN configs c ON b.config_id = c.id WHERE c.key = '$key' AND b.quantity = 'comm_bytes_per_step_combined' AND b.framework = 'megatron-tp-sp+ddp'")
nnull=$(sqlite3 "$DB" "SELECT count(*) FROM baselines WHERE config_id IS NULL")
npub=$(sqlite3 "$DB" "SELECT count(*) FROM published")
# every source is a public one (a repository path, an arXiv paper) or says how it is derived
nsrc=$(sqlite3 "$DB" "SELECT count(*) FROM published WHERE NOT (source LIKE 'pytorch/%' OR source LIKE 'NVIDIA/%' OR source LIKE 'huggingface/%' OR source LIKE 'arXiv %' OR source LIKE 'derived, %')")
ncsv=$(($(wc -l < "$SRC/results/published.csv") - 1))
[ "$nlinked" = "$nplan" ] || fail "--db: $nlinked rows linked to the config, want $nplan (written twice: replaced)"
[ "$ncross" = 1 ] || fail "--db: $ncross megatron-tp-sp+ddp crosses for the config, want 1"
[ "$nnull" = "$nrows" ] || fail "--db: $nnull rows with config_id NULL, want $nrows"
[ "$npub" = "$ncsv" ] || fail "--db: published has $npub rows, the CSV $ncsv (loaded 3 times)"
[ "$nsrc" = 0 ] || fail "--db: $nsrc published rows without a public source"
echo "--db: $nlinked linked + $nnull unlinked baselines rows, $npub published rows"

[ "$fails" = 0 ] || { echo "baselines.sh: $fails failure(s)"; exit 1; }
echo "baselines.sh: all checks passed"
