#!/bin/sh
# verify/workloads.sh: the single-layer workloads end to end (`shardbench run`):
# embedding (tok_embeddings), attention (x + attention(attention_norm(x))),
# feed_forward (x + feed_forward(ffn_norm(x))) and output (norm + output + the
# cross-entropy), bench/harness/run.c.
#   1. Each workload on torchtitan-tp-sp (tp 2), fsdp (dp_shard 2), fsdp-tp-cp (cp 2 x
#      tp 2), dp (dp_replicate 2) and megatron-tp (tp 2) is ok against the unsharded
#      reference, having compared exactly its own weights (counted here from the
#      workload's definition: a weight of another layer type would add 3 tensors);
#      its FLOPs per token are TorchTitan's count (torchtitan/models/utils.py
#      get_dense_model_nparams_and_flops: 6 x the matmul parameters + 12 L H hd seq for
#      attention) over its modules, derived here; its measured peak memory is within
#      the estimate (bench/harness/memory.c, an upper bound).
#   2. Comm rows per step equal the counts derived here (b s h: the rank's activation,
#      e the element size, t = 2, W = 2; ring wire bytes: AR 2(n-1)/n, AG / RS
#      (n-1)/n of the payload):
#        feed_forward, megatron-tp: the MLP's g (AR forward) and f (AR backward) of
#          Megatron-LM (arXiv:1909.08053 sec. 3, Fig. 3a), b s h e each, nothing else;
#        attention, torchtitan-tp-sp: sequence parallel's AG before and RS after the
#          attention, forward and backward (arXiv:2205.05198 sec. 4.2.2: half a layer's
#          4 AG + 4 RS), b s h e each, plus the AR of attention_norm's weight gradient
#          (h e: its gradient is a partial sum over the sequence shards);
#        output, torchtitan-tp-sp: the AG of the norm's output before the column-split
#          output and its RS in backward, loss parallel's 3 ARs of b s f64 scalars
#          (max, sum of exp, target logit), the AR of norm's weight gradient;
#        embedding, fsdp: FSDP2's AG forward, AG backward (reshard_after_forward) and RS
#          of the V x h table (arXiv:2304.11277 sec. 3.2), nothing else (the root unit
#          holds no weight);
#        attention under fsdp-tp-cp: collectives on cp (sdpa_cp); feed_forward there:
#          none on cp.
#   3. It can fail: SHARDBENCH_FAULT perturbs a workload's gradient or skips its
#      reduction, and the run reports a mismatch naming the weight.
#   4. pp > 1 is skipped with the reason; a typo in a plan is still bad input (exit 2,
#      one line naming FILE:LINE) on a workload it does not concern; --save-trace and
#      `baselines --workload` refuse the single-layer workloads.
#   5. A world-2 sweep of every shipped plan x the four workloads: no "not implemented"
#      skip, no mismatch or failure, every skip for a misfit named.
NAME=workloads
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

BATCH=4
SEQ=8
run() { "$SB" run --plans-dir "$PLANS" --steps 1 --warmup 1 --batch $BATCH --seq $SEQ --json "$@"; }

# expect LABEL COMM FLAGS...: the run is ok, compared its weights, counts its FLOPs;
# COMM: the name of the comm derivation to check (none: no comm check)
expect() {
  label=$1
  comm=$2
  shift 2
  checks=$((checks + 1))
  run "$@" >"$tmp/r.json" 2>"$tmp/e"
  rc=$?
  if [ $rc -ne 0 ]; then
    fail "$label: exit $rc: $(cat "$tmp/e") $(head -c 400 "$tmp/r.json")"
    return
  fi
  checks=$((checks + 1))
  python3 - "$tmp/r.json" "$comm" <<'EOF' >"$tmp/p" 2>&1 || fail "$label: $(cat "$tmp/p")"
import json, sys
r = json.load(open(sys.argv[1]))
comm_case = sys.argv[2]
if r["status"] != "ok":
    sys.exit(f"status {r['status']}: {r['reason']}")
key = dict(kv.split("=", 1) for kv in r["key"].split())
mesh = dict(d.split(":") for d in key["mesh"].split(",")) if key["mesh"] != "1" else {}
R, W, C, T = (int(mesh.get(d, 1)) for d in ("dp_replicate", "dp_shard", "cp", "tp"))
e = 8 if key["dtype"] == "f64" else 4
batch, S, wl = int(key["batch"]), int(key["seq"]), key["workload"]
# debugmodel (TorchTitan's llama3_args["debugmodel"]): FFN hidden int(2*4h/3) rounded
# up to multiple_of 256
h, H, KV, V = 256, 16, 16, 2048
hd = h // H
F = -(-int(2 * 4 * h / 3) // 256) * 256
# the workload's weights, from its definition
weights = {
    "embedding": {"tok_embeddings": V * h},
    "attention": {"attention_norm": h, "wq": H * hd * h, "wk": KV * hd * h,
                  "wv": KV * hd * h, "wo": h * H * hd},
    "feed_forward": {"ffn_norm": h, "w1": F * h, "w2": h * F, "w3": F * h},
    "output": {"norm": h, "output": V * h},
}[wl]
nw, steps = len(weights), 2  # 1 warm-up + 1 timed step
want = steps * (1 + nw) + nw  # each step's loss and gradients, the final weights
if r["compared"] != want:
    sys.exit(f"compared {r['compared']} tensors, want {want} ({nw} weights)")
# TorchTitan's flops_per_token over the workload's modules: 6 (N - N_embedding) +
# 12 L H hd seq for the attention layer
N = sum(weights.values())
fpt = 6 * (N - weights.get("tok_embeddings", 0)) + (12 * H * hd * S if wl == "attention" else 0)
# tflops and tokens_per_s come with 9 significant digits (%.9g): their ratio is good to
# ~2e-9; 1e-6 relative is above that and far below a miscounted module (a norm's
# 6 h is 1e-3 of the smallest count here)
got = r["tflops"] * 1e12 / r["tokens_per_s"]
if abs(got - fpt) > 1e-6 * max(fpt, 1):
    sys.exit(f"flops per token {got:.9g}, want {fpt}")
if not r["peak_mem_bytes"] <= r["est_mem_bytes"]:
    sys.exit(f"peak {r['peak_mem_bytes']} over the estimate {r['est_mem_bytes']}")
rows = {(c["op"], c["mesh_dim"], c["phase"]): c for c in r["comm"]}
b = batch // (R * W)
act = b * (S // C) * h * e
ar = lambda n, x: 2 * (n - 1) / n * x
ag = lambda n, x: (n - 1) / n * x
want_rows = {
    "ffn-megatron": {("all_reduce", "tp", "forward"): (1, act, ar(T, act)),
                     ("all_reduce", "tp", "backward"): (1, act, ar(T, act))},
    "attn-sp": {("all_gather", "tp", "forward"): (1, act, ag(T, act)),
                ("reduce_scatter", "tp", "forward"): (1, act, ag(T, act)),
                ("all_gather", "tp", "backward"): (1, act, ag(T, act)),
                ("reduce_scatter", "tp", "backward"): (1, act, ag(T, act)),
                ("all_reduce", "tp", "optimizer"): (1, h * e, ar(T, h * e))},
    "output-sp": {("all_gather", "tp", "forward"): (1, act, ag(T, act)),
                  ("all_reduce", "tp", "forward"): (3, 3 * b * S * 8, 3 * ar(T, b * S * 8)),
                  ("reduce_scatter", "tp", "backward"): (1, act, ag(T, act)),
                  ("all_reduce", "tp", "optimizer"): (1, h * e, ar(T, h * e))},
    "emb-fsdp": {("all_gather", "dp_shard", "forward"): (1, V * h * e, ag(W, V * h * e)),
                 ("all_gather", "dp_shard", "backward"): (1, V * h * e, ag(W, V * h * e)),
                 ("reduce_scatter", "dp_shard", "backward"): (1, V * h * e, ag(W, V * h * e))},
}
if comm_case in want_rows:
    exp = want_rows[comm_case]
    if set(rows) != set(exp):
        sys.exit(f"comm rows {sorted(rows)}, want {sorted(exp)}")
    # wire bytes are exact here (W = t = 2 halve whole byte counts); 0.5 B absorbs only
    # the JSON's decimal printing
    for k, (calls, payload, wire) in exp.items():
        c = rows[k]
        if (c["calls"], c["payload_bytes"]) != (calls, payload) or abs(c["wire_bytes"] - wire) > 0.5:
            sys.exit(f"{k}: calls {c['calls']} payload {c['payload_bytes']} wire "
                     f"{c['wire_bytes']}, want {calls} {payload} {wire}")
elif comm_case == "cp-rows":
    if not any(k[1] == "cp" for k in rows):
        sys.exit(f"no collective on cp (sdpa_cp did not run): {sorted(rows)}")
elif comm_case == "no-cp-rows":
    if any(k[1] == "cp" for k in rows):
        sys.exit(f"collectives on cp without attention: {sorted(rows)}")
elif comm_case != "none":
    sys.exit(f"unknown comm case {comm_case}")
print(f"{wl}: ok, {r['compared']} compared, worst {r['worst']} "
      f"{r['max_rel_err']:.2g} (tol {r['tolerance']:.1g}), {got:.6g} flop/token, "
      f"peak/est {r['peak_mem_bytes'] / r['est_mem_bytes']:.2f}")
EOF
  cat "$tmp/p"
}

# ---- 1, 2. every workload on the five plans; the derived comm rows -----------------------
for wl in embedding attention feed_forward output; do
  c_sp=none c_fsdp=none c_cp=none c_mt=none
  case $wl in
  embedding) c_fsdp=emb-fsdp ;;
  attention) c_sp=attn-sp c_cp=cp-rows ;;
  feed_forward) c_mt=ffn-megatron c_cp=no-cp-rows ;;
  output) c_sp=output-sp ;;
  esac
  expect "$wl torchtitan-tp-sp tp 2" $c_sp --workload $wl --plan torchtitan-tp-sp --tp 2
  expect "$wl fsdp dp_shard 2" $c_fsdp --workload $wl --plan fsdp --dp-shard 2
  expect "$wl fsdp-tp-cp cp 2 tp 2" $c_cp --workload $wl --plan fsdp-tp-cp --cp 2 --tp 2
  expect "$wl dp dp_replicate 2" none --workload $wl --plan dp --dp-replicate 2
  expect "$wl megatron-tp tp 2" $c_mt --workload $wl --plan megatron-tp --tp 2
done
expect "attention f64 fsdp-tp-cp cp 2 tp 2" cp-rows --workload attention --plan fsdp-tp-cp --cp 2 --tp 2 --dtype f64

# ---- 3. it can fail ------------------------------------------------------------------------
# mismatch LABEL PARAM FAULT FLAGS...: the run is a mismatch whose worst is PARAM's
mismatch() {
  label=$1
  param=$2
  fault=$3
  shift 3
  checks=$((checks + 1))
  SHARDBENCH_FAULT=$fault run "$@" >"$tmp/r.json" 2>"$tmp/e"
  rc=$?
  st=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], r["worst"])' "$tmp/r.json" 2>&1)
  case "$rc $st" in
  "1 mismatch $param"*) echo "fault $label: $st" ;;
  *) fail "$label: exit $rc, '$st' (want exit 1, mismatch naming $param)" ;;
  esac
}
mismatch "perturb w2 under megatron-tp" layers.0.feed_forward.w2.weight \
  perturb-grad:layers.0.feed_forward.w2.weight:1 --workload feed_forward --plan megatron-tp --tp 2
mismatch "skip the embedding's reduce under dp" tok_embeddings.weight \
  skip-reduce:tok_embeddings.weight --workload embedding --plan dp --dp-replicate 2
mismatch "skip wq's reduce-scatter under fsdp" layers.0.attention.wq.weight \
  skip-reduce:layers.0.attention.wq.weight --workload attention --plan fsdp --dp-shard 2

# ---- 4. skips and bad input -----------------------------------------------------------------
run --workload attention --plan pp --pp 2 >"$tmp/r.json" 2>"$tmp/e"
check "attention on pp 2: exit" $? 0
check "attention on pp 2: skipped, naming pp" \
  "$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"], "pp=2" in r["reason"])' "$tmp/r.json")" \
  "skipped True"
sed 's/^layers\.\*\.feed_forward\.w1 /layers.*.feed_forwrd.w1 /' "$PLANS/torchtitan-tp-sp.plan" >"$tmp/typo.plan"
line=$(grep -n 'feed_forwrd' "$tmp/typo.plan" | cut -d: -f1)
refused "typo in a plan, attention workload" "typo.plan:$line:.*feed_forwrd" \
  "$SB" run --workload attention --plan "$tmp/typo.plan" --tp 2 --batch $BATCH --seq $SEQ
refused "unknown workload" "--workload: expected .*output, got 'outputs'" \
  "$SB" run --workload outputs --tp 2 --plans-dir "$PLANS"
refused "--save-trace with a single-layer workload" "--save-trace:.*workload 'output'" \
  "$SB" run --workload output --tp 2 --plans-dir "$PLANS" --save-trace "$tmp/t.safetensors"
check "no trace written" "$(ls "$tmp"/t.safetensors 2>/dev/null)" ""
refused "baselines --workload attention" "--workload: expected model or block" \
  "$SB" baselines --model debugmodel --tp 2 --batch 8 --seq 32 --plan torchtitan-tp-sp \
  --plans-dir "$PLANS" --workload attention

# ---- 5. a sweep of every shipped plan -------------------------------------------------------
"$SB" sweep --world 2 --plans-dir "$PLANS" --plans all --workloads embedding,attention,feed_forward,output \
  --dtypes f32 --batch 4 --seq 8 --steps 1 --warmup 0 --db "$tmp/s.db" >"$tmp/o" 2>"$tmp/e"
check "sweep: exit" $? 0
check "sweep: no 'not implemented' skip" \
  "$(q "$tmp/s.db" "SELECT count(*) FROM results WHERE reason LIKE '%not implemented%'")" 0
check "sweep: no mismatch or failure" \
  "$(q "$tmp/s.db" "SELECT count(*) FROM results WHERE status NOT IN ('ok', 'skipped')")" 0
# every workload runs on every plan that fits the 3 world-2 shapes but pp: dp, tp,
# dp_shard and cp plans (the counts of run configs per workload are equal)
check "sweep: each workload runs the same configs" \
  "$(q "$tmp/s.db" "SELECT count(DISTINCT n) FROM (SELECT count(*) AS n FROM results r JOIN configs c ON c.id = r.config_id WHERE r.status = 'ok' GROUP BY c.workload)")" 1
check "sweep: ok configs per workload > 0" \
  "$(q "$tmp/s.db" "SELECT count(*) > 0 FROM results WHERE status = 'ok'")" 1
# every skip names a misfit of the plan and the mesh (none is about the workload but pp)
check "sweep: every skip names a misfit" \
  "$(q "$tmp/s.db" "SELECT count(*) FROM results WHERE status = 'skipped' AND NOT (reason LIKE 'plan ''%'' has no dim %' OR reason LIKE 'plan ''%'' fixes %' OR reason LIKE 'tp=1: %' OR reason LIKE 'pp=1: %' OR reason LIKE 'dp_shard=1, cp=1: %' OR reason LIKE 'dp_shard=%: plan % has no fully_shard%' OR reason LIKE 'pp=2: workload % is one layer type%')")" 0
echo "sweep: $(q "$tmp/s.db" "SELECT status || ' ' || count(*) FROM results GROUP BY status" | tr '\n' ' ')"
finish
