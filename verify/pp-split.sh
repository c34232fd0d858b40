#!/bin/sh
# verify/pp-split.sh: the pipeline's stage split as a plan gives it (TorchTitan's
# parallelism.module_fqns_per_model_part, pipeline_parallel_first_stage_less_layers /
# _last_stage_less_layers; torchtitan/distributed/pipeline_parallel.py
# generate_llm_fqn_per_model_part and pipeline_module_split).
# The oracle: rank 0 (pp rank 0) holds its own stages' weights only (the others' are
# released, as pipeline_module_split deletes them) and keeps their gradients only, so its
# parameter and gradient bytes are each the sum of those weights' sizes, and AdamW's
# state (exp_avg, exp_avg_sq in the weights' dtype) twice that, derived here from the
# debugmodel's shapes (dim 256, 16 heads = kv heads, vocab 2048, FFN hidden 768; f64):
#   tok_embeddings 2048 x 256; one block: wq, wk, wv, wo 256 x 256, w1, w3 768 x 256,
#   w2 256 x 768, two norms 256.
# Each run also verifies against the unsharded reference (status ok), and the
# interleaved split's sends equal its stage boundaries on rank 0, derived here.
# Bad splits: a name typo is bad input (exit 2 naming the plan's line); a split that
# does not fit the model or the mesh is skipped with the reason.
NAME=pp-split
. "${srcdir:-.}/verify/harness-common.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: $NAME: python3 is missing (scripts/install-deps)"; exit 77; }

E=8 # f64
EMB=$((2048 * 256 * E))
BLOCK=$(((4 * 256 * 256 + 3 * 768 * 256 + 2 * 256) * E))
MB=4 # microbatches: batch 4 over microbatch size 1

# plan NAME LINE...: the pp plan with NAME and the extra settings lines
plan() {
  n=$1
  shift
  sed "s/^name = pp$/name = $n/" "$PLANS/pp.plan" >"$tmp/$n.plan"
  for l in "$@"; do
    # settings go above the first [dim] header (pp.plan has none)
    echo "$l" >>"$tmp/$n.plan"
  done
}
run() {
  "$SB" run --plans-dir "$tmp" --model debugmodel:n_layers=3 --dtype f64 --batch 4 --seq 16 \
    --steps 1 --warmup 0 --json "$@"
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# expect LABEL BYTES SENDS PLAN...: ok, rank 0's parameter and gradient bytes (its stages'
# weights), its optimizer bytes (2 x), its forward sends
expect() {
  label=$1 grads=$2 sends=$3
  shift 3
  run "$@" >"$tmp/r.json" 2>"$tmp/e" || { fail "$label: run failed: $(tail -1 "$tmp/e")"; return; }
  check "$label: status" "$(field "$tmp/r.json" 'd["status"]')" ok
  check "$label: rank 0's gradient bytes = its stages' weights" \
    "$(field "$tmp/r.json" 'd["mem_grads_bytes"]')" "$grads"
  check "$label: rank 0's parameter bytes = its stages' weights" \
    "$(field "$tmp/r.json" 'd["mem_params_bytes"]')" "$grads"
  check "$label: rank 0's AdamW bytes = 2 x its stages' weights" \
    "$(field "$tmp/r.json" 'd["mem_optimizer_bytes"]')" $((2 * grads))
  check "$label: rank 0's forward sends" \
    "$(field "$tmp/r.json" 'sum(c["calls"] for c in d["comm"] if c["op"] == "send" and c["phase"] == "forward")')" \
    "$sends"
}

plan pp-default
# TorchTitan's split of 3 layers + embedding + head = 5 slots over 2 stages: 3 + 2;
# stage 0 = tok_embeddings + layers.0, layers.1
expect "generated split" $((EMB + 2 * BLOCK)) $MB --plan pp-default --pp 2
# the embedding as 2 layers: 6 slots, 3 + 3; stage 0 = tok_embeddings + layers.0
plan pp-first2 "pipeline_parallel_first_stage_less_layers = 2"
expect "first_stage_less_layers 2" $((EMB + BLOCK)) $MB --plan pp-first2 --pp 2
# the head as 0 layers: 4 slots, 2 + 2; stage 0 = tok_embeddings + layers.0
plan pp-last0 "pipeline_parallel_last_stage_less_layers = 0"
expect "last_stage_less_layers 0" $((EMB + BLOCK)) $MB --plan pp-last0 --pp 2
plan pp-emb 'module_fqns_per_model_part = [["tok_embeddings"], ["layers.0", "layers.1", "layers.2", "norm", "output"]]'
expect "explicit: the embedding alone" $EMB $MB --plan pp-emb --pp 2
# 4 stages on pp 2, interleaved (loop placement): rank 0 holds stages 0 and 2 and sends
# each microbatch's activation at both stages' ends
plan pp-4 "pipeline_parallel_schedule = Interleaved1F1B" \
  'module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"], ["norm", "output"]]'
sed -i '/^pipeline_parallel_schedule = 1F1B$/d' "$tmp/pp-4.plan"
expect "explicit: 4 stages, interleaved" $((EMB + 2 * BLOCK)) $((2 * MB)) --plan pp-4 --pp 2

# does not fit: skipped with the reason
skipped() {
  label=$1 why=$2
  shift 2
  run "$@" >"$tmp/r.json" 2>"$tmp/e"
  check "$label: skipped" "$(field "$tmp/r.json" 'd["status"]')" skipped
  r=$(field "$tmp/r.json" 'd["reason"]')
  case $r in *"$why"*) check "$label: reason" ok ok ;; *) fail "$label: reason '$r' lacks '$why'" ;; esac
}
skipped "4 stages on pp 4 under 1F1B" "gives 1 stages per pp rank (pp=4); Interleaved1F1B needs 2" \
  --plan pp-4 --pp 4
skipped "2 stages on pp 4" "has 2 stages, not a multiple of pp=4" --plan pp-emb --pp 4
plan pp-short 'module_fqns_per_model_part = [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]]'
skipped "a split of 2 layers on 3" "norm before layers.2" --plan pp-short --pp 2
# a typo: bad input, before any work
plan pp-typo 'module_fqns_per_model_part = [["tok_embeddings", "layer.0"], ["layers.1", "layers.2", "norm", "output"]]'
refused "module name typo" "pp-typo.plan:[0-9]*: module_fqns_per_model_part: stage 0: 'layer.0' is not" \
  run --plan pp-typo --pp 2
finish
