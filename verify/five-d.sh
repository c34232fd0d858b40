#!/bin/sh
# verify/five-d.sh: all five of TorchTitan's dims on one run (plans/torchtitan-5d.plan:
# pipeline parallel 1F1B x HSDP over dp_replicate and dp_shard x cp x context parallel's
# pass-KV ring x TP + SP with loss parallel) on pp 2, dp_replicate 2, dp_shard 2, cp 2,
# tp 2 = 32 ranks of the threads backend, debugmodel, batch 8, seq 16:
#   1. verified against the unsharded reference (every step's loss and every gradient,
#      the weights after the last update), f64 and f32;
#   2. every dim carries its own traffic, and rank 0's per-step counts equal those
#      derived here from the layout. Rank 0 is pp rank 0: TorchTitan's split of 6 layers
#      + embedding + head (8 slots) over 2 stages gives it tok_embeddings and layers 0-2,
#      i.e. 4 FSDP units and 3 attentions; m = batch 8 / (dp_replicate 2 x dp_shard 2) =
#      2 microbatches of 1 sequence:
#        pp           forward sends m (its activation at the stage's end), backward
#                     recvs m; each [1, 16 / (cp 2 x tp 2), 256] f64 (sequence parallel
#                     and cp shard the sequence) = 8192 bytes
#        dp_shard_cp  FSDP under pp: one all_gather and one reduce_scatter per unit per
#                     step (the gathered weights kept over the microbatches)
#        dp_replicate HSDP: one all_reduce per unit per step
#        cp           the ring: per attention and microbatch C - 1 = 1 send forward and
#                     2C - 1 = 3 backward
#   3. it can fail: a skipped reduction and a perturbed gradient on one rank are each a
#      mismatch naming the weight.
NAME=five-d
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

MESH="--pp 2 --dp-replicate 2 --dp-shard 2 --cp 2 --tp 2"
run() {
  # shellcheck disable=SC2086 # MESH is a list of flags
  "$SB" run --plans-dir "$PLANS" --plan torchtitan-5d $MESH --batch 8 --seq 16 --steps 1 \
    --warmup 1 --json "$@"
}
for dt in f64 f32; do
  if ! run --dtype $dt >"$tmp/r.json" 2>"$tmp/e"; then
    fail "$dt: run exit $?: $(tail -1 "$tmp/e")"
    continue
  fi
  check "$dt: world, status" "$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(d["key"].split("world=")[1], d["status"], d["compared"] > 0)' "$tmp/r.json")" "32 ok True"
  out=$(python3 - "$tmp/r.json" "$dt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
e = 8 if sys.argv[2] == "f64" else 4
m, units, attn, C = 2, 4, 3, 2
want = {
    ("send", "pp", "forward"): (m, m * 1 * (16 // (2 * 2)) * 256 * e),
    ("recv", "pp", "backward"): (m, m * 1 * (16 // (2 * 2)) * 256 * e),
    ("all_gather", "dp_shard_cp", "forward"): (units, None),
    ("reduce_scatter", "dp_shard_cp", "backward"): (units, None),
    ("all_reduce", "dp_replicate", "backward"): (units, None),
    ("send", "cp", "forward"): (attn * m * (C - 1), None),
    ("send", "cp", "backward"): (attn * m * (2 * C - 1), None),
}
rows = {(c["op"], c["mesh_dim"], c["phase"]): c for c in d["comm"]}
bad = []
for k, (calls, payload) in want.items():
    c = rows.get(k)
    if not c or c["calls"] != calls or (payload is not None and c["payload_bytes"] != payload):
        bad.append(f"{k}: {c and (c['calls'], c['payload_bytes'])} want {(calls, payload)}")
dims = sorted({c["mesh_dim"] for c in d["comm"]})
if dims != ["cp", "dp_replicate", "dp_shard_cp", "pp", "tp"]:
    bad.append(f"mesh dims with traffic: {dims}")
# FSDP's group is dp_shard x cp, flattened: nothing of FSDP on dp_shard or cp alone
print("; ".join(bad) if bad else "ok")
PY
)
  check "$dt: rank 0's comm per step = the derived counts" "$out" ok
done

# it can fail
for f in skip-reduce:layers.0.attention.wq.weight perturb-grad:layers.1.feed_forward.w2.weight:5; do
  SHARDBENCH_FAULT=$f run --dtype f64 >"$tmp/r.json" 2>"$tmp/e"
  rc=$?
  check "fault $f: exit 1, a mismatch naming the weight" \
    "$rc $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["status"], d["worst"].split(" ")[0])' "$tmp/r.json")" \
    "1 mismatch $(echo "$f" | cut -d: -f2)"
done
finish
