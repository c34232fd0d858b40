#!/bin/sh
# verify/explain-op.sh: checks `shardbench explain --op` end to end (make check
# runs it).
#
# Good inputs: the matmul oracle of PyTorch's test_comm_mode_with_dtensor
# (test/distributed/tensor/debug/test_comm_mode.py: world 2, x [8,8] S(0) @
# y [8,32] S(0): output S(0), one all_gather), TorchTitan's colwise linear
# (output S(2), no comm), mean over an uneven shard, view / reshape, einsum's
# strategy counts (TestEinsumStrategies in test/distributed/tensor/test_op_strategy.py),
# --backward, --json; each run must exit 0
# and say "full_tensor: match" for every output (text) or "match": true (JSON).
# Bad inputs: each class must exit 2 with
# exactly one line on stderr naming the flag, and nothing on stdout. Each
# failure prints the command it ran and its output. It runs from the build
# directory; the program is ${top_builddir:-.}/bench/shardbench.

NAME=explain-op.sh
. "$(dirname "$0")/explain-common.sh"

# Rows of the ledger section that starts with the line matching $1 (up to the
# next "totals") whose first word is $2.
ledger_rows() {
  awk -v start="$1" -v op="$2" '
    index($0, start) { on = 1; next }
    on && /totals over all/ { on = 0 }
    on && $1 == op { n++ }
    END { print n + 0 }' "$OUT"
}

# ---- help -----------------------------------------------------------------------
checks=$((checks + 1))
if ! "$SB" help explain >"$OUT" 2>"$ERR" || ! grep -q -- '--input SPEC' "$OUT" ||
   ! grep -q -- '--backward' "$OUT"; then
  fail help-explain-op "shardbench help explain documents no --input / --backward" help explain
fi

# ---- the matmul oracle (test_comm_mode_with_dtensor) ------------------------------
ok matmul-oracle \
  -e 'strategies: 4 generated, 4 after the shardability filter' \
  -r '^chosen: \[S\(0\)\] \[R\] -> \[S\(0\)\],' \
  -r '^  \* +[0-9]+  \[S\(0\)\] \[R\] -> \[S\(0\)\] .*<- chosen' \
  -e 'input 1: [S(0)] -> [R]' -e 'trace: S(0)->R' \
  -r '^  output 0: \[S\(0\)\] \[8, 32\] f32' \
  -n 1 \
  -- explain --mesh 2 --op matmul --input '[8,8] S(0)' --input '[8,32] S(0)'
checks=$((checks + 1))
if [ "$(ledger_rows 'forward: rank 0 ledger' all_gather)" -ne 1 ] ||
   [ "$(ledger_rows 'forward: rank 0 ledger' all_reduce)" -ne 0 ] ||
   [ "$(ledger_rows 'forward: rank 0 ledger' reduce_scatter)" -ne 0 ] ||
   ! grep -q 'ledger of dt_op_call (1 call)' "$OUT"; then
  fail matmul-oracle-ledger "rank 0's ledger is not exactly 1 all_gather" \
    explain --mesh 2 --op matmul --input '[8,8] S(0)' --input '[8,32] S(0)'
fi

# ---- TorchTitan colwise linear (test_aten_linear shape): S(2), no comm -----------
ok linear-colwise \
  -r '^chosen: \[R\] \[S\(0\)\] -> \[S\(2\)\],' -e 'ledger of dt_op_call (0 calls)' \
  -e 'totals over all 4 ranks: (no collectives)' -e '(none: every input is already' \
  -r '^  output 0: \[S\(2\)\] \[2, 5, 32\] f32' \
  -- explain --mesh 4 --op linear --input '[2,5,16] R' --input '[32,16] S(0)'
# Rowwise: x S(-1), W S(1): the contracting option, output P(sum), no comm.
ok linear-rowwise \
  -r '^chosen: \[S\(2\)\] \[S\(1\)\] -> \[P\(sum\)\],' -e 'ledger of dt_op_call (0 calls)' \
  -- explain --mesh 4 --op linear --input '[2,5,16] S(-1)' --input '[32,16] S(1)'

# ---- reductions over uneven shards ---------------------------------------------
ok mean-uneven -n 1 -r '^  output 0: .* \[4\] f32' \
  -- explain --mesh 4 --op mean --input '[7,4] S(0)' --dim 0
ok mean-uneven-2d-keepdim -n 1 -r '^  output 0: .* \[1, 1\] f64' \
  -- explain --mesh 2x2 --op mean --input '[7,5] S(0),S(1)' --dims 0,1 --keepdim --dtype f64
ok sum-uneven-partial-input -n 1 \
  -- explain --mesh 4 --op sum --input '[9,3] P(sum)' --dims 1
ok mean-backward -n 2 -e 'grad input 0:' \
  -- explain --mesh 4 --op mean --input '[7,4] S(0)' --dim 0 --backward

# ---- einsum: the strategy counts of TestEinsumStrategies (5 on 1-D, 25 on 2-D) ---
ok einsum-bmm-1d -e 'strategies: 5 generated' \
  -- explain --mesh 2 --op einsum --eq 'bmk,bkn->bmn' --input '[4,6,8] S(0)' --input '[4,8,6] R'
ok einsum-bmm-2d -e 'strategies: 25 generated' -n 3 \
  -- explain --mesh 2x2 --op einsum --eq 'bmk,bkn->bmn' --input '[4,6,8] S(0),S(2)' \
     --input '[4,8,5] S(0),R' --backward

# ---- view / reshape (propagate_shape_and_sharding, torch/distributed/tensor/_ops/_view_ops.py)
# [4,6] -> [4,-1] maps each dim to itself (InputDim): the shard stays, no comm,
# for view and reshape alike.
ok view-keep-last -n 1 -e 'ledger of dt_op_call (0 calls)' -r '^  output 0: \[S\(1\)\] \[4, 6\] f32' \
  -- explain --mesh 4 --op view --input '[4,6] S(1)' --to 4,-1
ok reshape-keep-last -n 1 -e 'ledger of dt_op_call (0 calls)' -r '^  output 0: \[S\(1\)\] \[4, 6\] f32' \
  -- explain --mesh 4 --op reshape --input '[4,6] S(1)' --to 4,-1
ok view-split-first -n 1 -- explain --mesh 2 --op view --input '[4,6] S(0)' --to 2,2,6
bad view-flatten-sharded --op explain --mesh 4 --op view --input '[4,6] S(1)' --to 24
ok reshape-flatten-sharded -n 1 -e 'input 0: [S(1)] -> [R]' \
  -- explain --mesh 4 --op reshape --input '[4,6] S(1)' --to 24
ok transpose -n 1 -r '^chosen: \[S\(1\)\] -> \[S\(0\)\],' \
  -- explain --mesh 4 --op transpose --input '[4,6] S(1)' --dims 0,1
ok permute -n 1 -- explain --mesh 2 --op permute --input '[4,6,2] S(1)' --dims 2,0,1

# ---- --backward ------------------------------------------------------------------
ok matmul-backward -n 3 -e 'grad input 0: [S(0)] [8, 8] f32' -e 'grad input 1:' \
  -e "backward: rank 0 ledger of matmul's backward" \
  -- explain --mesh 2 --op matmul --input '[8,8] S(0)' --input '[8,32] S(0)' --backward
ok matmul-backward-2d-f64 -n 3 \
  -- explain --mesh 2x2 --op matmul --input '[6,8] S(0),S(1)' --input '[8,5] S(0),R' \
     --backward --dtype f64
ok linear-backward -n 3 \
  -- explain --mesh 4 --op linear --input '[2,5,16] R' --input '[32,16] S(0)' --backward
ok add-broadcast-backward -n 3 \
  -- explain --mesh 2 --op add --input '[4,6] S(0)' --input '[6] R' --backward
ok scale -n 1 -- explain --mesh 2 --op scale --input '[5,3] P(sum)' --scalar 0.5
ok softmax-backward -n 2 \
  -- explain --mesh 2 --op softmax --input '[6,5] S(1)' --dim 1 --backward
ok swiglu-backward -n 3 \
  -- explain --mesh 2 --op swiglu --input '[4,6] S(1)' --input '[4,6] S(1)' --backward

# ---- rms_norm, rope, sdpa, embedding, cross_entropy ------------------------------
ok rms-norm-backward -n 3 \
  -- explain --mesh 2 --op rms_norm --input '[3,8] S(0)' --input '[8] R' --backward
ok rope -n 1 -- explain --mesh 2 --op rope --input '[1,4,2,8] S(1)' --scalar 10000
ok sdpa-backward -n 4 \
  -- explain --mesh 2 --op sdpa --input '[1,4,6,8] S(1)' --input '[1,2,6,8] S(1)' \
     --input '[1,2,6,8] S(1)' --backward
# context parallel: the ring's send/recv inside the kernel, the all-gather's K, V
ok sdpa-cp-ring -n 2 -e 'send            -      cp' \
  -- explain --mesh 2 --names cp --op sdpa_cp --input '[2,16,4,8] S(1)' \
     --input '[2,16,2,8] S(1)' --input '[2,16,2,8] S(1)' --dim 0 --i0 1 --i1 4 --i2 1
ok sdpa-cp-allgather -n 2 -e 'all_gather      -      cp' \
  -- explain --mesh 2 --names cp --op sdpa_cp --input '[2,16,4,8] S(1)' \
     --input '[2,16,2,8] S(1)' --input '[2,16,2,8] S(1)' --dim 0 --i0 1 --i1 4 --i2 0
ok embedding-rowwise-backward -n 2 -e 'grad input 1: none (ids)' \
  -- explain --mesh 2 --op embedding --input '[16,4] S(0)' --input '[2,5] R i64' --backward
ok cross-entropy-backward -n 3 -e 'output 1: [R] [2, 5] f64' \
  -- explain --mesh 2 --op cross_entropy --input '[2,5,10] S(2)' --input '[2,5] S(0) i64' \
     --backward

# ---- --json ----------------------------------------------------------------------
ok json-matmul -- explain --mesh 2 --op matmul --input '[8,8] S(0)' --input '[8,32] S(0)' \
  --backward --json
if have "$PYTHON3" json-matmul-fields; then
  checks=$((checks + 1))
  if ! "$PYTHON3" - "$OUT" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["strategies"]
assert d["op"] == "matmul" and d["match"] is True
assert s["generated"] == 4 and s["shardable"] == 4, s
ch = [c for c in s["candidates"] if c["chosen"]]
assert len(ch) == 1 and ch[0]["index"] == s["chosen"] and ch[0]["outputs"] == [["S(0)"]], ch
assert d["outputs"][0]["placements"] == ["S(0)"] and d["outputs"][0]["shape"] == [8, 32]
assert [r["input"] for r in d["redistributions"]] == [1]
assert d["redistributions"][0]["trace"] == "S(0)->R"
fw = d["run"]["forward"]
assert [r["op"] for r in fw["ledger_rank0"]] == ["all_gather"], fw["ledger_rank0"]
assert fw["outputs"][0]["match"] is True
assert all(g["match"] for g in d["run"]["backward"]["input_grads"])
EOF
  then
    fail json-matmul-fields "the JSON lacks the expected fields (see the traceback)" \
      explain --mesh 2 --op matmul --input '[8,8] S(0)' --input '[8,32] S(0)' --backward --json
  fi
fi

# ---- bad input: exit 2, one line naming the flag --------------------------------
X='[8,8] R'
bad unknown-op --op explain --mesh 2 --op nope --input "$X"
checks=$((checks + 1))
"$SB" explain --mesh 2 --op nope --input "$X" >"$OUT" 2>"$ERR"
grep -q 'known: .*matmul' "$ERR" || fail unknown-op-lists "the error lists no known ops" \
  explain --mesh 2 --op nope --input "$X"
bad empty-op --op explain --mesh 2 --op '' --input "$X"
bad too-few-inputs --input explain --mesh 2 --op matmul --input "$X"
bad too-many-inputs --input explain --mesh 2 --op scale --scalar 2 --input "$X" --input "$X"
bad input-no-bracket --input explain --mesh 2 --op silu --input '8,8 R'
bad input-unclosed --input explain --mesh 2 --op silu --input '[8,8 R'
bad input-shape --input explain --mesh 2 --op silu --input '[8,x] R'
bad input-no-placements --input explain --mesh 2 --op silu --input '[8,8]'
bad input-placement-count --input explain --mesh 2x2 --op silu --input '[8,8] S(0)'
bad input-placement-syntax --input explain --mesh 2 --op silu --input '[8,8] S(q)'
bad input-shard-range --input explain --mesh 2 --op silu --input '[8,8] S(2)'
bad input-dtype-word --input explain --mesh 2 --op silu --input '[8,8] R f16'
bad input-partial-ids --input explain --mesh 2 --op embedding --input '[16,4] R' \
  --input '[2,5] P(sum) i64'
bad infer-matmul-k --op explain --mesh 2 --op matmul --input '[8,7] R' --input '[8,8] R'
bad infer-mean-dim --op explain --mesh 2 --op mean --input '[8,8] R' --dim 5
bad infer-einsum-eq --op explain --mesh 2 --op einsum --eq 'ab,bc->ad' --input "$X" --input "$X"
bad attr-unread --eq explain --mesh 2 --op matmul --eq 'mk,kn->mn' --input "$X" --input "$X"
bad attr-needed --eq explain --mesh 2 --op einsum --input "$X" --input "$X"
bad attr-softmax-dim --dim explain --mesh 2 --op softmax --input "$X"
bad attr-dim-and-dims --dim explain --mesh 2 --op sum --input "$X" --dim 0 --dims 1
bad attr-transpose-3 --dims explain --mesh 2 --op transpose --input "$X" --dims 0,1,1
bad attr-dims-syntax --dims explain --mesh 2 --op sum --input "$X" --dims 0,x
bad attr-to-syntax --to explain --mesh 2 --op reshape --input "$X" --to 4,-2
bad attr-eq-long --eq explain --mesh 2 --op einsum --input "$X" --input "$X" \
  --eq 'abcdefgh,abcdefgh->abcdefghabcdefghabcdefgh'
bad attr-scalar --scalar explain --mesh 2 --op scale --input "$X" --scalar 1e999
bad dtype-bf16 --dtype explain --mesh 2 --op silu --input "$X" --dtype bf16
bad planner --planner explain --mesh 2 --op silu --input "$X" --planner fast
bad mesh --mesh explain --mesh 0 --op silu --input "$X"
bad no-mesh --mesh explain --op silu --input "$X"
bad world --mesh explain --mesh 2 --world 3 --op silu --input "$X"
bad shape-flag --shape explain --mesh 2 --op silu --input "$X" --shape 8,8
bad from-flag --from explain --mesh 2 --op silu --input "$X" --from R
bad unknown-flag --bogus explain --mesh 2 --op silu --input "$X" --bogus
bad flag-no-value --backward explain --mesh 2 --op silu --input "$X" --backward=1
bad stray-arg stray explain --mesh 2 --op silu --input "$X" stray

finish
