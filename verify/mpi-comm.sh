#!/bin/sh
# verify/mpi-comm.sh: runs verify/test_comm (every collective, op and dtype against
# a reference) under mpirun with 2, 3, 4 and 8 processes, on the MPI backend.
# Exits 77 (SKIP) when this build has no MPI (mpi-common.sh); 1 when any run fails.
. "$(dirname "$0")/mpi-common.sh"
status=0
for np in 2 3 4 8; do
  echo "== mpirun -np $np test_comm --backend mpi"
  if ! sb_mpirun "$np" "$sb_top/verify/test_comm" --backend mpi; then
    echo "FAIL: test_comm --backend mpi with $np processes"
    status=1
  fi
done
exit $status
