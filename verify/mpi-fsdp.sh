#!/bin/sh
# verify/mpi-fsdp.sh: FSDP under mpirun with 4 processes (the MPI backend):
# `shardbench run --backend mpi` of fsdp-tp-sp on dp_shard 2 x tp 2 (the mesh's
# tp-before-dp_shard order is a split of MPI's world communicator) and of zero1 on
# dp_replicate 2 x dp_shard 2, each verified against the unsharded reference
# (status ok, exit 0). Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
status=0
for cfg in "--plan fsdp-tp-sp --dp-shard 2 --tp 2" "--plan zero1 --dp-replicate 2 --dp-shard 2"; do
  echo "== mpirun -np 4 shardbench run --backend mpi $cfg"
  # shellcheck disable=SC2086 # cfg is a list of flags
  out=$(sb_mpirun 4 "$sb_top/bench/shardbench" run --backend mpi --plans-dir "${srcdir:-.}/plans" \
    $cfg --dtype f64 --batch 8 --seq 16 --steps 1 --warmup 1 2>&1)
  rc=$?
  echo "$out" | grep -E "status|worst"
  if [ $rc -ne 0 ] || ! echo "$out" | grep -q "status: ok"; then
    echo "FAIL: $cfg: exit $rc"
    status=1
  fi
done
exit $status
