#!/bin/sh
# verify/explain.sh: checks `shardbench explain` end to end (make check runs it).
#
# Good inputs: 1-D to 5-D meshes, even and uneven shapes, every placement kind,
# both planners, text and --json; each run must exit 0 and say
# "full_tensor: match", and a few cases must show the trace of the greedy plan
# of PyTorch's greedy planner (generate_greedy_transform_infos in
# torch/distributed/tensor/_redistribute.py) as test/distributed/tensor/test_redistribute.py
# pins it (paths and comm counts).
# Bad inputs: each class must exit 2 with exactly one line on stderr naming the
# flag, and nothing on stdout. Each failure prints the command it ran and its
# output. It runs from the build directory; the program is
# ${top_builddir:-.}/bench/shardbench. It is not a unit test of the library
# (verify/test_*.c are).

NAME=explain.sh
. "$(dirname "$0")/explain-common.sh"

# ---- help ----------------------------------------------------------------------
checks=$((checks + 1))
if ! "$SB" help >"$OUT" 2>"$ERR" || ! grep -q 'explain' "$OUT"; then
  fail help "shardbench help does not list explain" help
fi
checks=$((checks + 1))
if ! "$SB" help explain >"$OUT" 2>"$ERR" || ! grep -q -- '--mesh' "$OUT"; then
  fail help-explain "shardbench help explain shows no --mesh" help explain
fi
checks=$((checks + 1))
if ! "$SB" explain --help >"$OUT" 2>"$ERR" || ! grep -q -- '--planner' "$OUT"; then
  fail explain-help "shardbench explain --help shows no --planner" explain --help
fi

# ---- greedy traces pinned by PyTorch's test_redistribute.py ----------------------
# 2x2 (S0,S1)->(S1,S0): 1: S1->R, 0: S0->S1, 1: R->S0 (2 comms).
ok 2x2-swap \
  -e 'S(0)S(1)->S(0)R->S(1)R->S(1)S(0)' \
  -r '^ +1 +1 \(dim1\) +S\(1\) -> R +all_gather' \
  -r '^ +2 +0 \(dim0\) +S\(0\) -> S\(1\) +all_to_all' \
  -r '^ +3 +1 \(dim1\) +R -> S\(0\) +chunk' \
  -e 'plan (greedy): 3 steps' \
  -- explain --mesh 2x2 --shape 8,8 --from 'S(0),S(1)' --to 'S(1),S(0)'
# 2x2 (S0,S1)->(S0,S0): 1: S1->S0 (1 comm).
ok 2x2-nest \
  -e 'S(0)S(1)->S(0)[0]S(0)[1]' -e 'plan (greedy): 1 step,' \
  -- explain --mesh 2x2 --shape 8,8 --from 'S(0),S(1)' --to 'S(0),S(0)'
# 2x2 (S0,S0)->(S1,S1): 1: S0->R, 0: S0->S1, 1: R->S1.
ok 2x2-nested-swap \
  -e 'S(0)[0]S(0)[1]->S(0)R->S(1)R->S(1)[0]S(1)[1]' \
  -- explain --mesh 2x2 --names dp,tp --shape 8,8 --from 'S(0),S(0)' --to 'S(1),S(1)'
# 2x2, 3-d tensor, (S1,S1)->(S1,S2): 1: S1->S2.
ok 2x2-3d \
  -e 'S(1)[0]S(1)[1]->S(1)S(2)' -e 'plan (greedy): 1 step,' \
  -- explain --mesh 2x2 --shape 4,8,8 --from 'S(1),S(1)' --to 'S(1),S(2)'
# 2x2x2 (S0,S1,S2)->(S2,S1,S0): 2: S2->R, 0: S0->S2, 2: R->S0.
ok 2x2x2-perm \
  -e 'S(0)S(1)S(2)->S(0)S(1)R->S(2)S(1)R->S(2)S(1)S(0)' \
  -- explain --mesh 2x2x2 --names dp,cp,tp --shape 8,8,8 --from 'S(0),S(1),S(2)' --to 'S(2),S(1),S(0)'
# 2x2x2 (S1,R,S0)->(R,S0,S0): 2: S0->R, 1: R->S0, 0: S1->R, 2: R->S0.
ok 2x2x2-mixed \
  -e 'S(1)RS(0)->S(1)RR->S(1)S(0)R->RS(0)R->RS(0)[0]S(0)[1]' \
  -- explain --mesh 2x2x2 --shape 8,8 --from 'S(1),R,S(0)' --to 'R,S(0),S(0)'
# 2x2x2 (S0,S0,S0)->(S1,S1,S1): the greedy trace of DistributeWithDeviceOrderTest.
ok 2x2x2-all \
  -e 'S(0)[0]S(0)[1]S(0)[2]->S(0)[0]S(0)[1]R->S(0)RR->S(1)RR->S(1)[0]S(1)[1]R->S(1)[0]S(1)[1]S(1)[2]' \
  -- explain --mesh 2x2x2 --shape 8,8 --from 'S(0),S(0),S(0)' --to 'S(1),S(1),S(1)'
# 2x2x2 (S1,S0,S0)->(R,S0,S0): 0: S1->R (1 comm).
ok 2x2x2-one \
  -e 'plan (greedy): 1 step,' -r '^ +1 +0 \(dp\) +S\(1\) -> R +all_gather' \
  -- explain --mesh 2x2x2 --names dp,cp,tp --shape 8,8 --from 'S(1),S(0),S(0)' --to 'R,S(0),S(0)'

# ---- geometry: torch.chunk and nested sharding (Shard in placement_types.py) -----
# [10] on 4: 3,3,3,1; [3] on 4: 1,1,1,0 with the empty shard at the end.
ok uneven-10 -r '^ +3 +\(3\) +\[1\] @ \[9\]' \
  -- explain --mesh 4 --shape 10 --from 'S(0)' --to R
ok uneven-3 -r '^ +3 +\(3\) +\[0\] @ \[3\] ' \
  -- explain --mesh 4 --shape 3 --from 'S(0)' --to R
# The docstring example of compute_local_shape_and_global_offset (torch/distributed/tensor/_utils.py):
# [2,5], (S1,S1) on 2x2: (2,2)@(0,0) (2,1)@(0,2) (2,1)@(0,3) (2,1)@(0,4).
ok nested-2x5 \
  -r '^ +0 +\(0, 0\) +\[2, 2\] @ \[0, 0\]' -r '^ +1 +\(0, 1\) +\[2, 1\] @ \[0, 2\]' \
  -r '^ +2 +\(1, 0\) +\[2, 1\] @ \[0, 3\]' -r '^ +3 +\(1, 1\) +\[2, 1\] @ \[0, 4\]' \
  -- explain --mesh 2x2 --shape 2,5 --from 'S(1),S(1)' --to R,R

# ---- more layouts: every kind, odd sizes, dtypes, 1-D to 5-D ---------------------
ok 1d-p-r -e 'all_reduce' -- explain --mesh 8 --shape 16 --from 'P(sum)' --to R
ok 1d-p-s -e 'reduce_scatter' -- explain --mesh 4 --shape 10,3 --from 'P(sum)' --to 'S(0)'
ok 1d-pmax -- explain --mesh 3 --shape 7,5 --from 'P(max)' --to 'S(1)'
ok 1d-pmin -- explain --mesh 2 --shape 5 --from 'P(min)' --to R
ok 1d-pavg -- explain --mesh 4 --shape 9 --from 'P(avg)' --to 'S(0)'
ok 1d-r-p -- explain --mesh 4 --shape 6 --from R --to 'P(sum)'
ok 1d-a2a -e 'all_to_all' -- explain --mesh 3 --shape 7,5 --from 'S(0)' --to 'S(1)'
ok 1d-neg -- explain --mesh 2 --shape 4,6 --from 'S(-1)' --to 'S(-2)'
ok 1d-world1 -- explain --mesh 1 --shape 5 --from 'S(0)' --to R
ok empty-dim -- explain --mesh 2x2 --shape 0,4 --from 'S(0),S(1)' --to 'R,S(0)'
ok f64 -- explain --mesh 2x2 --shape 6,10 --dtype f64 --from 'S(1),P(sum)' --to 'S(0),R'
ok bf16 -- explain --mesh 2x2 --shape 6,10 --dtype bf16 --from 'P(sum),S(0)' --to 'S(1),S(1)'
ok 3x3-uneven -- explain --mesh 3x3 --names a,b --shape 7,5 --from 'S(0),S(1)' --to 'S(1),S(0)'
ok 2x2x2-partial \
  -e 'R,S(0),S(0)' \
  -- explain --mesh 2x2x2 --names dp,cp,tp --shape 16,24 --from 'S(0),S(1),P(sum)' --to 'R,S(0),S(0)'
ok 2x2x2-pp -- explain --mesh 2x2x2 --shape 8 --from 'P(sum),P(max),S(0)' --to 'R,R,R'
ok 5d -- explain --mesh 2x1x2x1x2 --names a,b,c,d,e --shape 6,5,4 \
  --from 'S(0),R,S(1),P(sum),S(0)' --to 'R,S(2),S(0),P(sum),S(1)'
ok seed -- explain --mesh 2 --shape 5 --seed 12345 --from 'S(0)' --to R

# ---- the min-cost planner: never costs more than greedy -------------------------
mincost() {
  name=$1
  shift
  checks=$((checks + 1))
  "$SB" "$@" >"$OUT" 2>"$ERR"
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q 'full_tensor: match' "$OUT"; then
    fail "$name" "exit code $rc or no match" "$@"
    return
  fi
  own=$(sed -n 's/^plan (min-cost): .*estimated \([0-9.eE+-]*\) us$/\1/p' "$OUT")
  greedy=$(sed -n 's/^  greedy plan for comparison: .*estimated \([0-9.eE+-]*\) us .*/\1/p' "$OUT")
  if [ -z "$own" ] || [ -z "$greedy" ]; then
    fail "$name" "no min-cost and greedy estimates in the report" "$@"
    return
  fi
  if ! awk -v a="$own" -v b="$greedy" 'BEGIN { exit !(a <= b + 1e-9) }'; then
    fail "$name" "min-cost estimate $own us > greedy $greedy us" "$@"
  fi
}
mincost mincost-2x2x2 explain --mesh 2x2x2 --shape 8,8 --planner min-cost \
  --from 'S(0),S(0),S(0)' --to 'S(1),S(1),S(1)'
mincost mincost-2x2 explain --mesh 2x2 --shape 8,8 --planner min-cost --from 'S(0),S(1)' --to 'S(1),S(0)'
mincost mincost-partial explain --mesh 2x2x2 --shape 16,24 --planner min-cost \
  --from 'S(0),S(1),P(sum)' --to 'R,S(0),S(0)'

# ---- --json ------------------------------------------------------------------------
ok json-2x2 -e '"trace": "S(0)S(1)->S(0)R->S(1)R->S(1)S(0)"' -e '"ledger_totals"' \
  -- explain --mesh 2x2 --shape 8,8 --from 'S(0),S(1)' --to 'S(1),S(0)' --json
cp "$OUT" "$tmp/a.json"
ok json-mincost -e '"greedy_plan"' -- explain --mesh 2x2x2 --names 'dp,cp,tp' --shape 16,24 \
  --from 'S(0),S(1),P(sum)' --to 'R,S(0),S(0)' --planner min-cost --json
cp "$OUT" "$tmp/b.json"
if have "$PYTHON3" json-parse; then
  for j in a b; do
    checks=$((checks + 1))
    if ! "$PYTHON3" -m json.tool "$tmp/$j.json" >/dev/null 2>"$ERR"; then
      cp "$tmp/$j.json" "$OUT"
      fail "json-parse-$j" "python3 -m json.tool rejects the output" explain '(the json case above)'
    fi
  done
fi

# ---- bad input: exit 2, one line naming the flag ---------------------------------
G="--shape 8,8 --from S(0),R --to R,R"
# shellcheck disable=SC2086 # $G is split on purpose (no glob characters in it)
{
  bad mesh-syntax --mesh explain --mesh 2x $G
  bad mesh-zero --mesh explain --mesh 2x0 $G
  bad mesh-dims --mesh explain --mesh 2x1x1x1x1x2 --shape 8,8 --from 'S(0),R,R,R,R,R' --to R,R,R,R,R,R
  bad mesh-too-big --mesh explain --mesh 64x32 $G
  bad mesh-world --mesh explain --mesh 2x2 --world 8 $G
  bad mesh-missing --mesh explain $G
  bad mesh-novalue --mesh explain $G --mesh
  bad names-count --names explain --mesh 2x2 --names dp $G
  bad names-dup --names explain --mesh 2x2 --names tp,tp $G
  bad names-ident --names explain --mesh 2x2 --names 1dp,tp $G
  bad names-empty --names explain --mesh 2x2 --names dp, $G
}
bad shape-syntax --shape explain --mesh 2x2 --shape 8,x --from 'S(0),R' --to R,R
bad shape-neg --shape explain --mesh 2x2 --shape 8,-1 --from 'S(0),R' --to R,R
bad shape-empty --shape explain --mesh 2x2 --shape '' --from 'S(0),R' --to R,R
bad shape-rank --shape explain --mesh 2 --shape 1,1,1,1,1,1,1,1,1 --from 'S(0)' --to R
bad shape-huge --shape explain --mesh 2 --shape 1000000,1000000 --from 'S(0)' --to R
bad placement-syntax --from explain --mesh 2x2 --shape 8,8 --from 'S(x),R' --to R,R
bad placement-junk --to explain --mesh 2x2 --shape 8,8 --from 'S(0),R' --to 'R,Q'
bad placement-count --from explain --mesh 2x2 --shape 8,8 --from 'S(0)' --to R,R
bad placement-count-to --to explain --mesh 2x2 --shape 8,8 --from 'S(0),R' --to R,R,R
bad shard-range --from explain --mesh 2x2 --shape 8,8 --from 'S(2),R' --to R,R
bad shard-range-neg --to explain --mesh 2x2 --shape 8,8 --from 'S(0),R' --to 'S(-3),R'
bad s-to-p --to explain --mesh 2x2 --shape 8,8 --from 'S(0),R' --to 'P(sum),R'
bad p-to-p --to explain --mesh 2 --shape 8 --from 'P(sum)' --to 'P(max)'
bad dtype --dtype explain --mesh 2 --shape 8 --from 'S(0)' --to R --dtype f16
bad planner --planner explain --mesh 2 --shape 8 --from 'S(0)' --to R --planner fast
bad seed --seed explain --mesh 2 --shape 8 --from 'S(0)' --to R --seed x
bad unknown-flag --bogus explain --mesh 2 --shape 8 --from 'S(0)' --to R --bogus
bad unknown-flag-value --bogus explain --mesh 2 --shape 8 --from 'S(0)' --to R --bogus=1
bad flag-takes-no-value --json explain --mesh 2 --shape 8 --from 'S(0)' --to R --json=1
bad stray-arg stray explain --mesh 2 --shape 8 --from 'S(0)' --to R stray
bad unknown-cmd frobnicate frobnicate --mesh 2
bad unknown-top-flag --frob --frob
bad help-unknown nope help nope
bad no-command 'no command'

finish
