#!/bin/sh
# verify/mpi-redistribute.sh: runs verify/test_redistribute under mpirun with 4 and 8
# processes (the MPI backend): redistribute pairs, creation and full_tensor on 1-D,
# 2-D and 3-D meshes whose size is the world. Exits 77 (SKIP) when this build has
# no MPI (mpi-common.sh); 1 when any run fails.
. "$(dirname "$0")/mpi-common.sh"
status=0
for np in 4 8; do
  echo "== mpirun -np $np test_redistribute --backend mpi"
  if ! sb_mpirun "$np" "$sb_top/verify/test_redistribute" --backend mpi; then
    echo "FAIL: test_redistribute --backend mpi with $np processes"
    status=1
  fi
done
exit $status
