#!/bin/sh
# verify/mpi-mesh.sh: runs verify/test_mesh under mpirun with 4 and 8 processes
# (the MPI backend). Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
status=0
for np in 4 8; do
  echo "== mpirun -np $np test_mesh --backend mpi"
  if ! sb_mpirun "$np" "$sb_top/verify/test_mesh" --backend mpi; then
    echo "FAIL: test_mesh --backend mpi with $np processes"
    status=1
  fi
done
exit $status
