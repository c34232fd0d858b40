#!/bin/sh
# verify/cp.sh: context parallel end to end (`shardbench run`, lib/parallel/cp.c,
# lib/ops/attention_cp.c).
#   1. Each config verifies against the unsharded reference (every step's loss and every
#      gradient, the weights after the last update; f64 at the exact-mode tolerance, f32):
#      fsdp-cp (FSDP over dp_shard x cp), dp-cp (DDP over dp_replicate x cp), fsdp-tp-cp
#      (FSDP x CP x TP + SP, loss parallel), each with both rotate methods (allgather and
#      the pass-KV ring: the shipped plans with context_parallel_rotate_method rewritten
#      here), with load balancing off once, cp 2, 3 (GQA: 6 heads, 2 kv heads), 4 and 8.
#   2. Its collectives on cp equal the attention's, derived here from the model's shapes
#      (PyTorch's torch/distributed/tensor/experimental/_attention.py: pass-KV ring and
#      all-gather rotate methods). Per layer, with one rank's K (or V) of
#      X = b (S/C) (h_kv/t) hd elements (b: the rank's sequences, S/C its tokens, h_kv/t
#      its kv heads under TP):
#        ring: forward C-1 sends (and recvs) of [K | V], 2X each: each rank passes the
#        block it holds to the next cp rank until it has seen all C; backward C-1 again
#        (K and V re-rotated) plus C of the travelling [dK | dV] accumulator, which
#        visits every rank once and comes home: 2C - 1 sends of 2X;
#        allgather: forward one all_gather each of K and V (output C X), backward the
#        same two again and one reduce_scatter each of dK and dV (input C X).
#      Nothing else runs on cp: the gradients' reduction goes over the flattened data
#      group (FSDP's dp_shard_cp, DDP's dp_replicate x cp).
#   3. It can fail: SHARDBENCH_FAULT=skip-reduce:PARAM under dp-cp leaves a weight's
#      gradient summed over one cp rank's tokens only, a mismatch naming it.
#   4. Peak memory per rank falls with cp at a fixed global sequence (dp-cp, cp 1, 2, 4).
#   5. A sequence that does not divide into 2 cp chunks is refused up front (exit 2 from
#      run with one line, or a skip naming the divisor inside a sweep).
NAME=cp
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

SEQ=48
run() { "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 1 --batch 4 --seq "$SEQ" --json "$@"; }

# plan variants: the other rotate method, and no load balancing
for p in fsdp-cp dp-cp fsdp-tp-cp; do
  sed "s/^name = .*/name = $p-ring/; s/^context_parallel_rotate_method = .*/context_parallel_rotate_method = ring/" \
    "$PLANS/$p.plan" >"$tmp/$p-ring.plan"
  sed "s/^name = .*/name = $p-allgather/; s/^context_parallel_rotate_method = .*/context_parallel_rotate_method = allgather/" \
    "$PLANS/$p.plan" >"$tmp/$p-allgather.plan"
done
sed 's/^name = .*/name = dp-cp-nolb/; s/^context_parallel_load_balance = .*/context_parallel_load_balance = false/' \
  "$PLANS/dp-cp.plan" >"$tmp/dp-cp-nolb.plan"

# expect LABEL FLAGS...: the run is ok and its cp collectives match the derivation
expect() {
  label=$1
  shift
  checks=$((checks + 1))
  run "$@" >"$tmp/r.json" 2>"$tmp/e"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$label: exit $rc: $(cat "$tmp/e") $(head -c 400 "$tmp/r.json")"
    return
  fi
  checks=$((checks + 1))
  python3 - "$tmp/r.json" "$PLANS" "$tmp" <<'EOF' >"$tmp/p" 2>&1 || fail "$label: $(cat "$tmp/p")"
import json, os, sys
r = json.load(open(sys.argv[1]))
if r["status"] != "ok":
    sys.exit(f"status {r['status']}: {r['reason']}")
key = dict(kv.split("=", 1) for kv in r["key"].split())
mesh = dict(d.split(":") for d in key["mesh"].split(",")) if key["mesh"] != "1" else {}
R, W, C, T = (int(mesh.get(d, 1)) for d in ("dp_replicate", "dp_shard", "cp", "tp"))
es = 8 if key["dtype"] == "f64" else 4
batch, S = int(key["batch"]), int(key["seq"])
plan = [f"{d}/{key['plan']}.plan" for d in sys.argv[2:4]]
rotate = "allgather"
for line in open(plan[0] if os.path.exists(plan[0]) else plan[1]):
    line = line.split("#")[0].strip()
    if line.startswith("context_parallel_rotate_method"):
        rotate = line.split("=")[1].strip()
# the model: debugmodel and its overrides (TorchTitan's llama3_args["debugmodel"])
cfg = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, vocab=2048)
for kv in key["model"].split(":")[1:]:
    k, v = kv.split("=")
    cfg[k] = int(v)
L, hd = cfg["n_layers"], cfg["dim"] // cfg["n_heads"]
# every step's loss and every weight's gradient, and every final weight were compared
nw, steps = 9 * L + 3, 2
if r["compared"] != steps * (1 + nw) + nw:
    sys.exit(f"the verdict compared {r['compared']} quantities, expected {steps * (1 + nw) + nw}")
b = batch // (R * W)
X = b * (S // C) * (cfg["n_kv_heads"] // T) * hd  # one rank's K of one layer, elements
want = {}
if C > 1 and rotate in ("ring", "alltoall"):
    for op in ("send", "recv"):
        want[(op, "cp", "forward")] = (L * (C - 1), L * (C - 1) * 2 * X * es)
        want[(op, "cp", "backward")] = (L * (2 * C - 1), L * (2 * C - 1) * 2 * X * es)
elif C > 1:
    want[("all_gather", "cp", "forward")] = (2 * L, 2 * L * C * X * es)
    want[("all_gather", "cp", "backward")] = (2 * L, 2 * L * C * X * es)
    want[("reduce_scatter", "cp", "backward")] = (2 * L, 2 * L * C * X * es)
# the gradients: FSDP's on dp_shard_cp (test_fsdp_cp derives its rows), DDP's over the
# flattened data dims, one bucket here (bucket_cap_mb 100 holds the whole model): the
# rank's weights once, on "cp" when it is the only data dim
F = cfg.get("multiple_of", 256) * -(-int(2 * 4 * cfg["dim"] / 3) // cfg.get("multiple_of", 256))
D, V, QD, KVD = cfg["dim"], cfg["vocab"], cfg["n_heads"] * hd, cfg["n_kv_heads"] * hd
nparams = 2 * V * D + D + L * (2 * D + QD * D + 2 * KVD * D + D * QD + 3 * F * D)
if key["plan"].startswith("dp-cp") and R == 1 and C > 1:
    want[("all_reduce", "cp", "backward")] = (1, nparams * es)
got = {(c["op"], c["mesh_dim"], c["phase"]): (c["calls"], c["payload_bytes"])
       for c in r["comm"] if c["mesh_dim"] == "cp"}
if got != want:
    sys.exit(f"cp collectives {sorted(got.items())}, derived {sorted(want.items())}")
groups = {c["mesh_dim"] for c in r["comm"]}
data = "dp_shard_cp" if "fsdp" in key["plan"] else "dp_replicate_cp" if R > 1 else "cp"
if C > 1 and data not in groups:
    sys.exit(f"no gradient reduction on {data}: groups {sorted(groups)}")
print(f"ok: {rotate}, X = {X}, error {r['max_rel_err']:.2e} (tolerance {r['tolerance']:.1e})")
EOF
  echo "  $label: $(cat "$tmp/p")"
}

GQA=debugmodel:n_layers=2:n_heads=6:n_kv_heads=2:dim=48
SMALL=debugmodel:n_layers=2
for rot in allgather ring; do
  expect "fsdp-cp $rot cp 2 f64" --plan "$tmp/fsdp-cp-$rot.plan" --cp 2 --dtype f64 --model $SMALL
  expect "fsdp-cp $rot dp_shard 2 x cp 2 f32" --plan "$tmp/fsdp-cp-$rot.plan" --dp-shard 2 --cp 2 --model $SMALL
  expect "dp-cp $rot dp_replicate 2 x cp 2 f64" --plan "$tmp/dp-cp-$rot.plan" --dp-replicate 2 --cp 2 --dtype f64 --model $SMALL
  expect "dp-cp $rot cp 3 GQA f64" --plan "$tmp/dp-cp-$rot.plan" --cp 3 --dtype f64 --model $GQA
  SEQ=64
  expect "dp-cp $rot cp 8 f32" --plan "$tmp/dp-cp-$rot.plan" --cp 8 --model $SMALL
  SEQ=48
  expect "fsdp-tp-cp $rot cp 2 x tp 2 f64" --plan "$tmp/fsdp-tp-cp-$rot.plan" --cp 2 --tp 2 --dtype f64 --model $SMALL
  expect "fsdp-tp-cp $rot dp_shard 2 x cp 2 x tp 2 f32" --plan "$tmp/fsdp-tp-cp-$rot.plan" --dp-shard 2 --cp 2 --tp 2 --model $SMALL
done
expect "dp-cp no load balancing, cp 4 f64" --plan "$tmp/dp-cp-nolb.plan" --cp 4 --dtype f64 --model $SMALL
SEQ=64
expect "fsdp-cp shipped, cp 4 f64" --plan fsdp-cp --cp 4 --dtype f64 --model $SMALL
SEQ=36

# 3. the check can fail
checks=$((checks + 1))
SHARDBENCH_FAULT=skip-reduce:layers.1.feed_forward.w2.weight run --plan dp-cp --cp 2 \
  --dtype f64 --model $SMALL >"$tmp/r.json" 2>"$tmp/e"
rc=$?
if [ $rc -ne 1 ] || ! grep -q '"status": "mismatch"' "$tmp/r.json" ||
  ! grep -q '"worst": "layers.1.feed_forward.w2.weight grad step 0"' "$tmp/r.json"; then
  fail "a skipped cp reduction: exit $rc: $(head -c 300 "$tmp/r.json")"
fi

# 4. peak memory per rank falls with cp at a fixed global sequence
checks=$((checks + 1))
for c in 1 2 4; do
  "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 0 --batch 1 --seq 512 --plan dp-cp \
    --cp $c --model $SMALL --json 2>"$tmp/e" | python3 -c 'import json,sys
r = json.load(sys.stdin); print(r["status"], r["peak_mem_bytes"], r["mem_activations_bytes"])'
done >"$tmp/mem" || fail "memory runs: $(cat "$tmp/e")"
python3 - "$tmp/mem" <<'EOF' >"$tmp/p" 2>&1 || fail "memory vs cp: $(cat "$tmp/p")"
import sys
rows = [l.split() for l in open(sys.argv[1])]
if len(rows) != 3 or any(r[0] != "ok" for r in rows):
    sys.exit(f"runs: {rows}")
act = [int(r[2]) for r in rows]
# the activations are per-token: halving the tokens per rank must at least cut them by a
# third (the attention's K/V blocks and scratch do not halve)
if not (act[1] < act[0] * 2 / 3 and act[2] < act[1] * 2 / 3):
    sys.exit(f"activation bytes per rank at cp 1, 2, 4: {act}")
print(f"activations per rank at cp 1, 2, 4: {act}")
EOF
echo "  memory: $(cat "$tmp/p")"

# 5. the sequence must divide into 2 cp chunks (x tp under sequence parallel)
checks=$((checks + 1))
run --plan dp-cp --cp 4 >"$tmp/r.json" 2>"$tmp/e"
rc=$?
if ! grep -q 'not divisible by 8 (2 x cp, load-balanced)' "$tmp/r.json" "$tmp/e"; then
  fail "seq 36 on cp 4: exit $rc: $(cat "$tmp/e") $(head -c 300 "$tmp/r.json")"
fi
finish
