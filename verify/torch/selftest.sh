#!/bin/sh
# Proves that oracle.py can fail: runs it against fake_shardbench.py (the same steps in
# PyTorch, so a clean run must pass) and against each planted bug of the fake (a moved
# gradient, loss or weight just above the tolerance, a wrong init law, rope on the wrong
# pairs, GQA heads tiled instead of interleaved, wrong metadata), each of which must make
# it exit 1; then a stale golden file, the comm table's verdicts, and two bad flags
# (exit 2, one line).
# Each failure must also print the line that names what was planted.
# Uses the GQA run (RUNS[2], f64, 2 layers): quick, and the only one where gqa-tile shows.
# Exit 0 all as expected, 1 otherwise, 77 without torch.
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "selftest.sh: SKIP: torch is not importable by $py" >&2
  exit 77
fi
fake="$here/fake_shardbench.py"
oracle="$here/oracle.py"
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
bad=0

expect() {  # expect RC PATTERN DESCRIPTION COMMAND...: exit RC and a line with PATTERN (fixed)
  want=$1; pattern=$2; what=$3; shift 3
  "$@" >"$log" 2>&1
  rc=$?
  if [ "$rc" -eq "$want" ] && grep -qF -- "$pattern" "$log"; then
    echo "ok   $what (exit $rc: $(grep -F -m1 -- "$pattern" "$log" | cut -c1-100))"
  else
    echo "FAIL $what: exit $rc (expected $want), '$pattern' $(grep -qF -- "$pattern" "$log" && echo found || echo missing); last lines:"
    tail -n 5 "$log" | sed 's/^/     /'
    bad=1
  fi
}

run_fake() { "$py" "$oracle" --shardbench "$fake" --runs 2 --no-comm --no-torchtitan "$@"; }

SB_FAKE_PLANT= expect 0 "oracle: PASS" "clean fake run" run_fake
"$py" -c "import sys; sys.path.insert(0, '$here'); import fake_shardbench as f
for k, (_, line) in f.PLANTS.items(): print(k + '\t' + line)" >"$log.plants" || bad=1
while IFS="$(printf '\t')" read -r plant line; do
  SB_FAKE_PLANT=$plant expect 1 "$line" "planted $plant" run_fake
done <"$log.plants"
rm -f "$log.plants"
# The committed golden holds PyTorch's numbers on shardbench's weights; the fake's differ.
SB_FAKE_PLANT= expect 1 "STALE" "stale golden" run_fake --check-only \
  --golden "$repo/verify/golden/debugmodel.json"
# The comm table's verdict: equal counts pass, the one explained difference passes only with
# its exact numbers, anything else is unexplained.
expect 0 "comm verdicts ok" "comm verdicts" "$py" -c "
import sys; sys.path.insert(0, '$here'); import oracle
f = lambda p, s, n=13: oracle.comm_rows('x', 2, p, s, n)[1]
assert not f({'forward': {'all_gather': 13}}, {'forward': {'all_gather': 13}})
assert f({'forward': {'all_gather': 13}}, {'forward': {'all_gather': 12}})
assert f({'backward': {'all_reduce': 1}}, {})
assert not f({'optimizer': {'all_reduce': 39}}, {'optimizer': {'all_reduce': 13}})
assert f({'optimizer': {'all_reduce': 39}}, {'optimizer': {'all_reduce': 13}}, 12)
assert f({'optimizer': {'all_reduce': 13}}, {'optimizer': {'all_reduce': 13}, 'backward': {'all_reduce': 13}})
print('comm verdicts ok')"
expect 2 "--runs 99" "bad --runs" "$py" "$oracle" --shardbench "$fake" --runs 99
[ "$(wc -l <"$log")" -eq 1 ] || { echo "FAIL bad --runs: not one line"; bad=1; }
expect 2 "not an executable" "missing --shardbench" "$py" "$oracle" --shardbench "$repo/no/such/shardbench"
[ "$(wc -l <"$log")" -eq 1 ] || { echo "FAIL missing --shardbench: not one line"; bad=1; }
[ $bad -eq 0 ] && echo "selftest: PASS" || echo "selftest: FAIL"
exit $bad
