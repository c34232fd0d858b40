#!/bin/sh
# verify/meta-run.sh: `shardbench run --device meta` (shape-only runs) end to end.
#   1. The debugmodel (2 layers) under FSDP (dp_shard 4), FSDP + TP + SP (4 x 2) and
#      all five dims (torchtitan-5d, 32 ranks): status shape-only, the roles (one;
#      two: the pp stages), and rank 0's memory split, peak and comm rows per step
#      equal those of the same config run for real on cuda-emu (one timed step, no
#      warm-up; and FSDP again after one warm-up step, a steady-state step with
#      AdamW's state): the oracle is the real run.
#      Planted: the second config's meta fields must differ from the first's real ones.
#   2. Uneven shards make roles: a vocab of 2050 over dp_shard 4 (FSDP shards the
#      embedding and output rows by torch.chunk: 513, 513, 513 and 511 rows) runs 2
#      roles, their counts summing to 4.
#   3. Bad input, one line on stderr and exit 2 before any work: --device meta with
#      --load-weights, --save-weights, --save-trace or --comm nccl, and a tp that does
#      not divide the heads. --db writes the run to shape_runs / shape_roles /
#      shape_comm and nothing to configs or results (verify/meta-sweep.sh compares
#      those rows with real runs').
NAME=meta-run
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "$NAME: SKIP (no python3 to read the JSON)"; exit 77; }

MODEL="debugmodel:n_layers=2"
# the fields compared: rank 0's mem split, the peak (max over ranks; shape-only: over
# roles), then rank 0's comm rows: op, mesh dim, phase, calls, bytes (a shape-only
# result: its first role's, rank 0's)
fields() {
  python3 -c 'import json,sys
d=json.load(sys.stdin)
r=d["roles"][0] if d.get("roles") else d
print(d["status"], *[r[k] for k in ("mem_params_bytes","mem_grads_bytes","mem_optimizer_bytes","mem_activations_bytes")], d["peak_mem_bytes"])
for c in r["comm"]: print(c["op"], c["mesh_dim"], c["phase"], c["calls"], c["payload_bytes"], c["wire_bytes"])'
}
same_as_real() {
  label=$1 world=$2
  shift 2
  "$SB" run --device meta --model "$MODEL" --batch "$BATCH" --seq 16 $STEPS --json "$@" >"$tmp/m.json" 2>"$tmp/err" ||
    { fail "$label: meta run exit $?: $(head -c 300 "$tmp/err")"; return; }
  "$SB" run --device cuda-emu --model "$MODEL" --batch "$BATCH" --seq 16 $STEPS --json "$@" \
    >"$tmp/r.json" 2>"$tmp/err" || { fail "$label: real run exit $?: $(head -c 300 "$tmp/err")"; return; }
  fields <"$tmp/m.json" >"$tmp/m.txt"
  fields <"$tmp/r.json" >"$tmp/r.txt"
  m=$(sed '1s/^shape-only //' "$tmp/m.txt")
  r=$(sed '1s/^ok //' "$tmp/r.txt")
  check "$label: status" "$(sed -n '1s/ .*//p' "$tmp/m.txt")" "shape-only"
  check "$label: memory split, peak and comm rows vs the real run" "$m" "$r"
  roles=$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["roles"]), sum(r["count"] for r in d["roles"]))' <"$tmp/m.json")
  check "$label: roles, ranks" "$roles" "$nroles $world"
  # planted: the comparison must tell this config from the previous one's real run
  if [ -n "${prev_real:-}" ]; then
    checks=$((checks + 1))
    [ "$m" = "$prev_real" ] && fail "$label: planted: indistinguishable from the previous config"
  fi
  prev_real=$r
}
BATCH=4 nroles=1 STEPS="--steps 1 --warmup 0"
same_as_real "fsdp 4" 4 --dp-shard 4 --plan fsdp
# a steady-state step (AdamW's state made by the warm-up step): the last step's figures
# against the real run's timed step, its peak over both steps
STEPS="--steps 1 --warmup 1"
same_as_real "fsdp 4, after a warm-up step" 4 --dp-shard 4 --plan fsdp
STEPS="--steps 1 --warmup 0"
same_as_real "fsdp 4 x tp 2" 8 --dp-shard 4 --tp 2 --plan fsdp-tp-sp
# all five dims, 32 ranks: two roles (the pp stages)
BATCH=8 nroles=2
same_as_real "5-D pp2 x dpr2 x dps2 x cp2 x tp2" 32 --pp 2 --dp-replicate 2 --dp-shard 2 --cp 2 \
  --tp 2 --plan torchtitan-5d

"$SB" run --device meta --model "debugmodel:n_layers=1:vocab=2050" --batch 4 --seq 16 --dp-shard 4 \
  --plan fsdp --json >"$tmp/u.json" 2>"$tmp/err" || fail "uneven: exit $?: $(head -c 300 "$tmp/err")"
check "uneven vocab: roles, ranks" \
  "$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["roles"]), sum(r["count"] for r in d["roles"]))' <"$tmp/u.json")" "2 4"

M="--device meta --dp-shard 2 --plan fsdp"
refused "meta --load-weights" "^shardbench run: --load-weights: " "$SB" run $M --load-weights "$tmp/none.safetensors"
refused "meta --save-weights" "^shardbench run: --save-weights: " "$SB" run $M --save-weights "$tmp/w.safetensors"
refused "meta --save-trace" "^shardbench run: --save-trace: " "$SB" run $M --save-trace "$tmp/t.json"
refused "meta --comm nccl" "^shardbench run: --comm: " "$SB" run $M --comm nccl
refused "meta tp 3 (16 heads)" "^shardbench run: " "$SB" run --device meta --tp 3 --plan megatron-tp
"$SB" run $M --db "$tmp/x.db" >/dev/null 2>"$tmp/err"
check "meta --db: exit" "$?" 0
check "meta --db: one shape-only run, its role and comm rows; no config or result" \
  "$(sqlite3 "$tmp/x.db" "SELECT (SELECT group_concat(status) FROM shape_runs), (SELECT count(*) FROM shape_roles), (SELECT count(*) > 0 FROM shape_comm), (SELECT count(*) FROM configs) + (SELECT count(*) FROM results)")" \
  "shape-only|1|1|0"
finish
