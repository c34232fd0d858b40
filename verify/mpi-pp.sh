#!/bin/sh
# verify/mpi-pp.sh: pipeline parallel under mpirun with 4 processes (the MPI backend):
# `shardbench run --backend mpi` of pp (1F1B, the stages' activations and gradients sent
# between processes, DDP over dp_replicate) on pp 2 x dp_replicate 2 and of pp-tp-sp (TP +
# SP inside each stage) on pp 2 x tp 2, each verified against the unsharded reference
# (status ok, exit 0). Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
status=0
for cfg in "--plan pp --pp 2 --dp-replicate 2" "--plan pp-tp-sp --pp 2 --tp 2"; do
  echo "== mpirun -np 4 shardbench run --backend mpi $cfg"
  # shellcheck disable=SC2086 # cfg is a list of flags
  out=$(sb_mpirun 4 "$sb_top/bench/shardbench" run --backend mpi --plans-dir "${srcdir:-.}/plans" \
    $cfg --model debugmodel:n_layers=2 --dtype f64 --batch 4 --seq 16 --steps 1 --warmup 1 2>&1)
  rc=$?
  echo "$out" | grep -E "status|worst| pp "
  if [ $rc -ne 0 ] || ! echo "$out" | grep -q "status: ok"; then
    echo "FAIL: $cfg: exit $rc"
    echo "$out" | tail -5
    status=1
  fi
done
exit $status
