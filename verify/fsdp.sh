#!/bin/sh
# verify/fsdp.sh: FSDP2 / HSDP / ZeRO-2 end to end (`shardbench run`, lib/parallel/fsdp.c).
#   1. Each config verifies against the unsharded reference (every step's loss and
#      every gradient, the weights after the last update; f64 at the exact-mode
#      tolerance, f32): fsdp over dp_shard 2, 3 (uneven rows), 4 and 8 (a model
#      whose vocabulary has fewer rows than ranks), hsdp (dp_replicate 2 x dp_shard
#      2), zero2, zero1 (dp_shard 3; dp_replicate 2 x dp_shard 2), fsdp-tp-sp
#      (dp_shard x tp 2: FSDP splits TP's local block, with an uneven FSDP split at
#      dp_shard 3; and HSDP + TP on dp_replicate 2 x dp_shard 2 x tp 2).
#   2. Its collectives on the dp dims equal FSDP2's, derived here from the plan's
#      units and the model's shapes (TorchTitan v0.2.0 apply_fsdp; PyTorch's
#      _fsdp_collectives.py foreach_all_gather / foreach_reduce):
#        units U = tok_embeddings, each of the L blocks, [norm, output] (the root
#        holds no weight left, so it issues nothing);
#        forward: one all_gather per unit;
#        backward: one all_gather per unit resharded after forward (the embedding
#        and the blocks; [norm, output] is kept: L + 1), none under ZeRO-2;
#        one reduce_scatter per unit; HSDP: one all_reduce over dp_replicate per unit;
#        bytes: a unit's flat segment per rank is P = sum over its weights of
#        ceil(rows / W) x (elements per row) of the tensor FSDP splits (TP's local
#        block under TP), padded as torch.chunk's largest chunk; the all_gather's
#        payload (its output) and the reduce_scatter's (its input) are W x P
#        elements, HSDP's all_reduce P;
#        ZeRO-1 instead: one all_reduce per unit of its whole gradients over dp_shard
#        (and one over dp_replicate), then after AdamW one all_gather per unit of the
#        updated row shards (W x P), phase optimizer.
#      fsdp-bf16 (FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32), read
#      from the plan's mixed_precision_* settings): the all_gathers move 2-byte elements,
#      the reduce_scatter 4; it verifies at the bf16 tolerance, over dp_shard 2 and 4.
#      f32 parameters on an f64 model (a plan written here): f32's tolerance, 4-byte gathers.
#   3. It can fail: SHARDBENCH_FAULT=skip-reduce:PARAM (a unit's reduce_scatter skipped
#      for one weight) is a mismatch naming it, under fsdp and under fsdp-bf16 (whose
#      looser tolerance still catches it).
#   4. Rank 0's persistent state (the run's measured weights, gradients and AdamW
#      state bytes) equals ZeRO's per-rank formulas with the exact shard sizes:
#      ZeRO-2/3 shard all three, ZeRO-1 only the optimizer state.
#   5. `shardbench baselines --plan P` shows the same bytes per step as the run
#      measures (its cross: TorchTitan's units with FSDP2's collectives).
#   Every run's verdict compared every step's loss and gradients and every final
#   weight (the JSON's "compared" count; a runner that skipped the gradients would
#   still find the final weights equal on an easy config).
NAME=fsdp
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

run() { "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 1 --batch 8 --seq 16 --json "$@"; }

# expect LABEL ZERO FLAGS...: the run is ok and its dp collectives match the derivation
expect() {
  label=$1 zero=$2
  shift 2
  checks=$((checks + 1))
  run "$@" >"$tmp/r.json" 2>"$tmp/e"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$label: exit $rc: $(cat "$tmp/e") $(head -c 400 "$tmp/r.json")"
    return
  fi
  checks=$((checks + 1))
  python3 - "$tmp/r.json" "$zero" "$PLANS" "$tmp" <<'EOF' >"$tmp/p" 2>&1 || fail "$label: $(cat "$tmp/p")"
import json, math, os, sys
r = json.load(open(sys.argv[1]))
zero = int(sys.argv[2])
if r["status"] != "ok":
    sys.exit(f"status {r['status']}: {r['reason']}")
key = dict(kv.split("=", 1) for kv in r["key"].split())
mesh = dict(d.split(":") for d in key["mesh"].split(","))
W, R, T = int(mesh.get("dp_shard", 1)), int(mesh.get("dp_replicate", 1)), int(mesh.get("tp", 1))
es = 8 if key["dtype"] == "f64" else 4
# FSDP2's MixedPrecisionPolicy, read from the plan's settings: all_gathers move param_dtype,
# the reduce_scatter (and HSDP's all_reduce) reduce_dtype; unset: the run's dtype
size = {"bf16": 2, "bfloat16": 2, "f32": 4, "float32": 4, "f64": 8, "float64": 8}
mp = {}
plan = [f"{d}/{key['plan']}.plan" for d in sys.argv[3:5]]  # shipped, or written here
for line in open(plan[0] if os.path.exists(plan[0]) else plan[1]):
    line = line.split("#")[0].strip()
    if line.startswith("["): break
    if "=" in line:
        k, v = (x.strip() for x in line.split("=", 1))
        mp[k] = size[v] if k.startswith("mixed_precision_") else None
ag_e, rs_e = mp.get("mixed_precision_param") or es, mp.get("mixed_precision_reduce") or es
# the model: debugmodel and its overrides (TorchTitan's llama3_args["debugmodel"])
cfg = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab=2048, multiple_of=256)
for kv in key["model"].split(":")[1:]:
    k, v = kv.split("=")
    cfg[k] = int(v)
D, L, V = cfg["dim"], cfg["n_layers"], cfg["vocab"]
# the verdict compared every step's loss and every weight's gradient, and every final weight
# (warm-up 1 + 1 timed step; weights: the embedding, 9 per block, norm, output)
nw, steps = 9 * L + 3, 2
if r["compared"] != steps * (1 + nw) + nw:
    sys.exit(f"the verdict compared {r['compared']} quantities, expected {steps * (1 + nw) + nw}")
hd = D // cfg["n_heads"]
QD, KVD = cfg["n_heads"] * hd, cfg["n_kv_heads"] * hd
F = int(2 * 4 * D / 3)
F = cfg["multiple_of"] * ((F + cfg["multiple_of"] - 1) // cfg["multiple_of"])
ceil = lambda a, b: -(-a // b)
tp_plan = "tp" in mesh
# rank 0's local block under TP (torchtitan-tp-sp: colwise wq wk wv w1 w3 output and the
# rowwise embedding shard dim 0; rowwise wo w2 shard dim 1; norms whole), then FSDP's P
def seg(rows, cols, tp_dim, w):
    if tp_plan and tp_dim == 0: rows = ceil(rows, T)
    if tp_plan and tp_dim == 1: cols = ceil(cols, T)
    return ceil(rows, w) * cols
def unit_sizes(w):  # [tok_embeddings, each block, [norm, output]] split over w ranks
    block = (seg(D, 1, None, w) + seg(QD, D, 0, w) + 2 * seg(KVD, D, 0, w) + seg(D, QD, 1, w)
             + seg(D, 1, None, w) + 2 * seg(F, D, 0, w) + seg(D, F, 1, w))
    return [seg(V, D, 0, w)] + [block] * L + [seg(D, 1, None, w) + seg(V, D, 0, w)]
units = unit_sizes(W)
whole = sum(unit_sizes(1))  # the unsharded TP-local count (ZeRO-1's weights and gradients)
raf = [True] * (L + 1) + [False]
if zero == 2: raf = [False] * len(units)
if zero == 1:
    # ZeRO-1: the whole (TP-local) gradients all-reduced per unit over dp_shard, then
    # over dp_replicate (reduce dtype); the updated row shards all-gathered per unit
    # after AdamW (the master weights' dtype)
    want = {("all_reduce", "dp_shard", "backward"): (len(units), whole * rs_e),
            ("all_gather", "dp_shard", "optimizer"): (len(units), sum(units) * W * es)}
    if R > 1: want[("all_reduce", "dp_replicate", "backward")] = (len(units), whole * rs_e)
else:
    want = {("all_gather", "dp_shard", "forward"): (len(units), sum(units) * W * ag_e),
            ("reduce_scatter", "dp_shard", "backward"): (len(units), sum(units) * W * rs_e)}
    nb = sum(raf)
    if nb: want[("all_gather", "dp_shard", "backward")] = (nb, sum(u for u, f in zip(units, raf) if f) * W * ag_e)
    if R > 1: want[("all_reduce", "dp_replicate", "backward")] = (len(units), sum(units) * rs_e)
got = {(c["op"], c["mesh_dim"], c["phase"]): (c["calls"], c["payload_bytes"])
       for c in r["comm"] if c["mesh_dim"] in ("dp_shard", "dp_replicate")}
if got != want:
    sys.exit(f"dp collectives {sorted(got.items())}, FSDP2's {sorted(want.items())}")
# 4. rank 0's persistent state, ZeRO's per-rank formulas (arXiv:1910.02054 sec. 5, Table 1)
# with this run's exact shard sizes: weights and gradients Psi e each and AdamW's two
# states 2 Psi e (e: the model's dtype, the master weights'), where Psi is the whole
# (TP-local) count under ZeRO-1's weights and gradients and rank 0's torch.chunk shard
# (the largest) for everything ZeRO shards
shard = sum(units)
mem = (r["mem_params_bytes"], r["mem_grads_bytes"], r["mem_optimizer_bytes"])
zmem = (whole * es, whole * es, 2 * shard * es) if zero == 1 else (shard * es, shard * es, 2 * shard * es)
if mem != zmem:
    sys.exit(f"persistent state (params, grads, optimizer) {mem}, ZeRO-{zero}'s {zmem}")
# REGRESSION check of the tier's selection (bench/harness/verdict.c sb_tolerance_params):
# bf16's 2^-5 / 2^-2 with bf16 parameters only; the f32 / f64 tiers are <= 2^17 x 2^-24,
# f32's (2^10 or 2^17 x 2^-24) with f32 parameters on an f64 model
tol = r["tolerance"]
if ((tol in (2**-5, 2**-2)) != (ag_e == 2) or (ag_e != 2 and tol > 2**-7) or
        (ag_e == 4 and es == 8 and tol not in (2**-14, 2**-7))):
    sys.exit(f"tolerance {tol} with {ag_e}-byte parameters, {es}-byte model")
print(f"ok: {len(units)} units, {sum(units)} elements per rank, all_gather {ag_e} B, "
      f"reduce_scatter {rs_e} B, tolerance {r['tolerance']:.1e}, error {r['max_rel_err']:.2e}, "
      f"persistent {sum(mem)} bytes")
EOF
  echo "  $label: $(cat "$tmp/p")"
}

expect "fsdp dp_shard 2 f64" 3 --plan fsdp --dp-shard 2 --dtype f64
expect "fsdp dp_shard 3 f64 (uneven)" 3 --plan fsdp --dp-shard 3 --dtype f64
expect "fsdp dp_shard 4 f32" 3 --plan fsdp --dp-shard 4
expect "fsdp dp_shard 8, 5 vocab rows" 3 --plan fsdp --dp-shard 8 --dtype f64 \
  --model debugmodel:dim=16:n_heads=2:n_kv_heads=2:vocab=5:multiple_of=4:n_layers=2
expect "hsdp 2 x 2 f64" 3 --plan hsdp --dp-replicate 2 --dp-shard 2 --dtype f64
expect "zero2 dp_shard 2 f64" 2 --plan zero2 --dp-shard 2 --dtype f64
expect "zero1 dp_shard 3 f64 (uneven)" 1 --plan zero1 --dp-shard 3 --dtype f64
expect "zero1 2 x 2 f64 (dp_replicate too)" 1 --plan zero1 --dp-replicate 2 --dp-shard 2 --dtype f64
# a batch smaller than the data ranks (8 sequences over 2 x 16 ranks: 12 of each 16 hold
# none): the ops leave some gradients Shard on dp_shard (their planner reduce-scatters
# them), which ZeRO-1 gathers before its all-reduce; the verdict only (the collectives are
# then the planner's, not FSDP's)
checks=$((checks + 1))
run --plan zero1 --dp-replicate 2 --dp-shard 16 --workload block >"$tmp/r.json" 2>"$tmp/e"
zs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$tmp/r.json" 2>&1)
[ "$zs" = ok ] || fail "zero1 2 x 16, batch 8: $zs $(tail -1 "$tmp/e")"
expect "fsdp-tp-sp 2 x 2 f64" 3 --plan fsdp-tp-sp --dp-shard 2 --tp 2 --dtype f64
expect "fsdp-tp-sp 3 x 2 f64 (uneven)" 3 --plan fsdp-tp-sp --dp-shard 3 --tp 2 --dtype f64
expect "fsdp-tp-sp, HSDP + TP 2 x 2 x 2 f32" 3 --plan fsdp-tp-sp --dp-replicate 2 --dp-shard 2 --tp 2
expect "fsdp-bf16 dp_shard 2 f32" 3 --plan fsdp-bf16 --dp-shard 2
expect "fsdp-bf16 dp_shard 4 f32" 3 --plan fsdp-bf16 --dp-shard 4
# f32 parameters on an f64 model: 4-byte all_gathers, 8-byte reduce_scatters, f32's tolerance
sed 's/^name = .*/name = fsdp-p32/; s/^mixed_precision_param = .*/mixed_precision_param = f32/
     s/^mixed_precision_reduce = .*/mixed_precision_reduce = f64/' "$PLANS/fsdp-bf16.plan" \
  >"$tmp/fsdp-p32.plan"
expect "fsdp f32 params, f64 model, dp_shard 2" 3 --plan "$tmp/fsdp-p32.plan" --dp-shard 2 --dtype f64

# 5. `shardbench baselines --plan` shows the same bytes: the data-parallel part of its
# cross for the config (TorchTitan's units with FSDP2's collectives) equals the run's
# measured wire bytes on dp_shard and dp_replicate (the TP part is Megatron-LM's paper
# formula, a different quantity: baselines.sh)
cross() { # cross LABEL PLAN MESH
  checks=$((checks + 1))
  b=$("$SB" baselines --plans-dir "$PLANS" --model debugmodel --batch 8 --seq 16 --dtype f32 \
    --mesh "$3" --plan "$2" --json 2>"$tmp/e" |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["plan"]["dp"]))')
  m=$(run --plan "$2" --mesh "$3" 2>/dev/null | python3 -c 'import json,sys
print(int(sum(c["wire_bytes"] for c in json.load(sys.stdin)["comm"]
              if c["mesh_dim"] in ("dp_shard", "dp_replicate"))))')
  if [ -n "$b" ] && [ "$b" = "$m" ]; then
    echo "  $1: baselines' dp part = measured = $m bytes"
  else
    fail "$1: baselines' dp part '$b' bytes, measured '$m' ($(cat "$tmp/e"))"
  fi
}
cross "fsdp dp_shard 4" fsdp dp_shard:4
cross "zero1 2 x 2" zero1 dp_replicate:2,dp_shard:2
cross "zero2 dp_shard 4" zero2 dp_shard:4
cross "fsdp-bf16 dp_shard 2" fsdp-bf16 dp_shard:2
cross "fsdp-tp-sp 2 x 2" fsdp-tp-sp dp_shard:2,tp:2

# 3. the check can fail
checks=$((checks + 1))
SHARDBENCH_FAULT=skip-reduce:layers.1.feed_forward.w2.weight run --plan fsdp --dp-shard 2 \
  --dtype f64 >"$tmp/r.json" 2>"$tmp/e"
rc=$?
if [ $rc -ne 1 ] || ! grep -q '"status": "mismatch"' "$tmp/r.json" ||
  ! grep -q '"worst": "layers.1.feed_forward.w2.weight grad step 0"' "$tmp/r.json"; then
  fail "a skipped reduce_scatter: exit $rc: $(head -c 300 "$tmp/r.json")"
fi
finish
