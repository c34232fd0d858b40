#!/bin/sh
# verify/mpi-parallel.sh: runs verify/test_parallel under mpirun with 4 processes
# (the MPI backend: TorchTitan TP+SP and Megatron TP on tp 4, TorchTitan on
# dp_replicate x tp = 2 x 2). Exits 77 (SKIP) when this build has no MPI
# (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
status=0
echo "== mpirun -np 4 test_parallel --backend mpi"
if ! sb_mpirun 4 "$sb_top/verify/test_parallel" --backend mpi; then
  echo "FAIL: test_parallel --backend mpi with 4 processes"
  status=1
fi
exit $status
