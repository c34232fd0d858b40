#!/bin/sh
# verify/plan.sh: `shardbench plan` end to end on the debugmodel.
#  1. bad input: one line on stderr, exit 2, nothing on stdout, the --db file untouched;
#  2. a search over three plans at 8 GPUs with --verify 2 --db: every ranked layout fits,
#     ranks follow tokens/s per GPU, the top two run for real and verify ok, and the DB
#     holds one plan_runs row, every layout of the JSON and the hardware file's text;
#  3. the memory a layout is given equals, by the hardware file's formula, the peak of
#     the same config's `run --device meta` (an independent run) times (1 +
#     alloc_overhead) plus reserved_gib, and tokens/s per GPU = tokens per step / step /
#     GPUs; a planted wrong peak fails that check;
#  4. the workers draw their tasks from a shared queue, in whatever order they come
#     free: --jobs 1 and --jobs 3 print the same table, byte for byte (the ranking and
#     its ties follow the search's order, not the workers'); --top 1 prints another
#     (the comparison sees a difference);
#  5. a plan that states activation_checkpoint_mode is searched at that AC alone (every
#     layout at it, none dominated; `none` stated means none), --ac overrides it, and a
#     plan that states none is searched at every --ac mode as before (its heavier modes
#     dominated: the count that tells the two apart); a published plan
#     (plans/published/) is found by name at its own AC;
#  6. pipeline_parallel_microbatches = pp cuts every local batch into pp microbatches,
#     microbatch size 1 into as many as the local batch.
NAME=plan
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null || { echo "SKIP: $NAME: no python3 (scripts/install-deps installs it)"; exit 77; }
pass() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { fails=$((fails + 1)); checks=$((checks + 1)); echo "FAIL: $*"; }
HW=h100-sxm-80gb
BASE="--model debugmodel --gpus 8 --hardware $HW --seq 64 --global-batch 16"

printf 'not a database\n' >"$tmp/text.db"
cp "$tmp/text.db" "$tmp/text.orig"
for case in "--gpus 0|--gpus" "--hardware nope|--hardware" "--plans nope|--plans" \
    "--mesh dp_shard:x|--mesh" "--ac sometimes|--ac" "--dtype f16|--dtype" \
    "--features turbo|--features" "--db $tmp/text.db|--db" "extra|unexpected" \
    "--top 0|--top"; do
  args=${case%|*} pat=${case#*|}
  # shellcheck disable=SC2086
  "$SB" plan $BASE $args >"$tmp/o" 2>"$tmp/e"
  rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/e")" -eq 1 ] && [ ! -s "$tmp/o" ] && grep -q -e "$pat" "$tmp/e"; then
    pass "bad input '$args': $(cat "$tmp/e")"
  else
    bad "bad input '$args': exit $rc, stderr $(head -c 200 "$tmp/e"), stdout $(wc -c <"$tmp/o") B"
  fi
done
"$SB" plan --model debugmodel --gpus 8 --hardware $HW --seq 64 >"$tmp/o" 2>"$tmp/e"
[ $? -eq 2 ] && grep -q -- --global-batch "$tmp/e" && pass "--global-batch is required" || bad "no --global-batch: $(cat "$tmp/e")"
cmp -s "$tmp/text.db" "$tmp/text.orig" && pass "refused --db file untouched" || bad "refused --db file changed"

# 2. the search, verified and stored
PLANS=fsdp,tt-fsdp-tp,hsdp
# shellcheck disable=SC2086
if "$SB" plan $BASE --plans $PLANS --verify 2 --db "$tmp/p.db" --json >"$tmp/p.json" 2>"$tmp/e"; then
  pass "plan --verify 2 --db exits 0"
else
  bad "plan --verify: $(cat "$tmp/e")"
fi
python3 - "$tmp/p.json" "$tmp/p.db" "${srcdir:-.}/results/hardware/$HW" >"$tmp/r" <<'PY'
import json, sqlite3, sys
d = json.load(open(sys.argv[1])); L = d['layouts']
db = sqlite3.connect(sys.argv[2])
def say(ok, what): print(('ok: ' if ok else 'FAIL: ') + what)
ranked = sorted([l for l in L if l['rank'] > 0], key=lambda l: l['rank'])
say(len(ranked) >= 2 and all(l['fits'] for l in ranked), f"{len(ranked)} ranked layouts, all fit")
say(all(l['rank'] == 0 for l in L if not l['fits']), "layouts that do not fit are unranked")
tps = [l['tokens_per_s_per_gpu'] for l in ranked]
say(tps == sorted(tps, reverse=True), "ranks follow tokens/s per GPU")
say([l.get('verdict') for l in ranked[:2]] == ['ok', 'ok'] and
    all('verdict' not in l for l in ranked[2:]), "the top two verify ok (and only they run)")
n = db.execute('SELECT count(*) FROM predictions').fetchone()[0]
say(n == len(L), f"DB predictions {n} = JSON layouts {len(L)}")
say(db.execute('SELECT count(*) FROM plan_runs').fetchone()[0] == 1, "one plan_runs row")
text = db.execute('SELECT h.text FROM hardware h JOIN plan_runs p ON p.hardware_id = h.id').fetchone()[0]
say(text == open(sys.argv[3]).read(), "the hardware file's text is stored")
v = db.execute("SELECT count(*) FROM predictions WHERE verdict = 'ok' AND rank <= 2").fetchone()[0]
say(v == 2, f"the DB has the two ok verdicts ({v})")
PY
cat "$tmp/r"
checks=$((checks + $(grep -c '^ok:\|^FAIL:' "$tmp/r")))
fails=$((fails + $(grep -c '^FAIL:' "$tmp/r")))

# 3. memory and throughput by the hardware file's formula, from an independent meta run
LAYOUT=$(python3 -c "import json,sys; l=[x for x in json.load(open(sys.argv[1]))['layouts'] if x['plan']=='tt-fsdp-tp' and x['rank']>0][0]; print(l['dp_shard'], l['tp'], l['local_batch'], l['ac'])" "$tmp/p.json")
set -- $LAYOUT
"$SB" run --device meta --model debugmodel --dp-shard "$1" --tp "$2" --plan "${srcdir:-.}/plans/capacity/tt-fsdp-tp.plan" \
  --seq 64 --batch $(($3 * $1)) --dtype bf16 --ac "$4" --json >"$tmp/meta.json" 2>"$tmp/e" || bad "meta run: $(cat "$tmp/e")"
formula() { # formula PLAN_JSON META_JSON HW_FILE PEAK_SCALE
  python3 - "$@" <<'PY'
import json, re, sys
L = [x for x in json.load(open(sys.argv[1]))['layouts'] if x['plan'] == 'tt-fsdp-tp' and x['rank'] > 0][0]
m = json.load(open(sys.argv[2])); hw = open(sys.argv[3]).read()
def key(k):
    return float(re.search(r'^' + k + r'\s*=\s*([0-9.e+-]+)', hw, re.M).group(1))
# the caching allocator's reserved peak of the meta run (its model of PyTorch's) plus what
# the runtime reserves; at most the HBM while the live peak fits (the allocator frees its
# cache and retries before it fails)
scale = float(sys.argv[4])
live = max(r['peak_mem_bytes'] for r in m['roles']) * scale
rv = max(r['reserved_peak_bytes'] for r in m['roles']) * scale
want = rv + key('reserved_gib') * 2**30
hbm = key('hbm_gib') * 2**30
if want > hbm and live + key('reserved_gib') * 2**30 <= hbm:
    want = hbm
ok = rv > 0 and abs(L['peak_bytes'] - want) <= 1e-9 * want  # the same doubles, summed in another order
print(('ok: ' if ok else 'FAIL: ') + f"peak {L['peak_bytes']:.17g} = meta reserved peak + reserved = {want:.17g}")
world = L['dp_shard'] * L['tp']
t = 16 * 64 / L['step_s'] / world  # global batch 16 x seq 64 per step
print(('ok: ' if abs(L['tokens_per_s_per_gpu'] - t) <= 1e-12 * t else 'FAIL: ') +
      f"tokens/s/GPU {L['tokens_per_s_per_gpu']:.17g} = tokens / step / GPUs = {t:.17g}")
PY
}
formula "$tmp/p.json" "$tmp/meta.json" "${srcdir:-.}/results/hardware/$HW" 1 >"$tmp/f"
cat "$tmp/f"
checks=$((checks + $(grep -c '^ok:\|^FAIL:' "$tmp/f")))
fails=$((fails + $(grep -c '^FAIL:' "$tmp/f")))
formula "$tmp/p.json" "$tmp/meta.json" "${srcdir:-.}/results/hardware/$HW" 1.01 >"$tmp/f2"
grep -q '^FAIL: peak' "$tmp/f2" && pass "a planted 1% larger peak fails the memory formula" || bad "planted peak not caught: $(cat "$tmp/f2")"

# 4. the same table from any number of workers
for j in 1 3; do
  # shellcheck disable=SC2086
  "$SB" plan --model debugmodel --gpus 8,16 --hardware $HW --seq 64 --global-batch 16 --top 4 --jobs $j >"$tmp/j$j" 2>"$tmp/e" || bad "plan --jobs $j: $(cat "$tmp/e")"
done
# shellcheck disable=SC2086
"$SB" plan --model debugmodel --gpus 8,16 --hardware $HW --seq 64 --global-batch 16 --top 1 --jobs 3 >"$tmp/jt" 2>/dev/null
if cmp -s "$tmp/j1" "$tmp/j3" && [ -s "$tmp/j1" ]; then
  pass "--jobs 1 and --jobs 3: the same table ($(wc -l <"$tmp/j1") lines)"
else
  bad "--jobs 1 and --jobs 3 differ: $(diff "$tmp/j1" "$tmp/j3" | head -5)"
fi
cmp -s "$tmp/j3" "$tmp/jt" && bad "--top 4 and --top 1 print the same table: the comparison cannot fail" ||
  pass "--top 1's table differs from --top 4's (the comparison can fail)"

# 5. a plan's own AC
mkac() { # mkac MODE FILE: tt-fsdp stating activation_checkpoint_mode = MODE
  sed "s/^mixed_precision_reduce = f32\$/&\\nactivation_checkpoint_mode = $1/" \
    "${srcdir:-.}/plans/capacity/tt-fsdp.plan" >"$2"
  grep -q "^activation_checkpoint_mode = $1\$" "$2" || bad "the test plan $2 was not written"
}
mkac full "$tmp/acfull.plan"
mkac none "$tmp/acnone.plan"
acs() { # acs NAME ARGS...: A_AC (the layouts' AC modes), A_DOM (dominated), A_N (layouts)
  name=$1
  shift
  A_AC=error A_DOM=- A_N=0
  # shellcheck disable=SC2086
  if "$SB" plan $BASE --json "$@" >"$tmp/ac.json" 2>"$tmp/e"; then
    # shellcheck disable=SC2046 # three words
    set -- $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); L=d['layouts']; print(','.join(sorted({l['ac'] for l in L})), d['dominated'], len(L))" "$tmp/ac.json")
    A_AC=$1 A_DOM=$2 A_N=$3
  else
    bad "plan $name: $(cat "$tmp/e")"
  fi
}
expect_ac() { # expect_ac WHAT ACS DOMINATED: the last acs's, with at least one layout
  if [ "$A_AC" = "$2" ] && [ "$A_DOM" = "$3" ] && [ "$A_N" -ge 1 ]; then
    pass "$1: ac $A_AC, $A_DOM dominated, $A_N layouts"
  else
    bad "$1: ac $A_AC, $A_DOM dominated, $A_N layouts (want ac $2, $3 dominated)"
  fi
}
acs full --plans "$tmp/acfull.plan"
expect_ac "a plan stating full" full 0
acs none --plans "$tmp/acnone.plan"
expect_ac "a plan stating none" none 0
# --ac overrides: none fits the debugmodel at every local batch, full is dominated
acs override --plans "$tmp/acfull.plan" --ac none,full
expect_ac "--ac none,full over a plan stating full" none "$A_N"
# the same plan stating nothing: every default mode, the heavier two dominated per layout
acs unstated --plans tt-fsdp
expect_ac "tt-fsdp (no AC stated)" none $((A_N * 2))
P8=tt-8b-fsdp-h100-202412
PAC=$(sed -n 's/^selective_ac_option = //p' "${srcdir:-.}/plans/published/$P8.plan")
acs "$P8" --plans "$P8"
expect_ac "published plan $P8 by name" "selective:$PAC" 0

# 6. pipeline_parallel_microbatches = pp: every local batch cut into pp microbatches
#    (TorchTitan's default n_microbatches before microbatch_size replaced it), where
#    pp.plan's microbatches of one sequence make as many as the local batch
sed 's/^pipeline_parallel_microbatch_size = 1$/pipeline_parallel_microbatches = pp/' \
  "${srcdir:-.}/plans/pp.plan" >"$tmp/ppn.plan"
mbs() { # mbs PLAN: the microbatches at local batch 4, then at 8
  for lb in 4 8; do
    "$SB" plan --model debugmodel --gpus 8 --hardware $HW --seq 64 --global-batch 16 --mesh pp:4,dp_replicate:2 \
      --plans "$1" --local-batch $lb --json 2>"$tmp/e" | python3 -c "import json,sys; print(*sorted({l['microbatches'] for l in json.load(sys.stdin)['layouts']}))"
  done | tr '\n' ' '
}
got=$(mbs "$tmp/ppn.plan")
[ "$got" = "4 4 " ] && pass "microbatches = pp: 4 at local batch 4 and at 8" ||
  bad "microbatches = pp: got '$got' at local batch 4, 8 (want 4 4): $(head -c 200 "$tmp/e")"
got=$(mbs "${srcdir:-.}/plans/pp.plan")
[ "$got" = "4 8 " ] && pass "microbatch size 1: 4 and 8 microbatches at local batch 4 and 8" ||
  bad "microbatch size 1: got '$got' at local batch 4, 8 (want 4 8)"
finish
