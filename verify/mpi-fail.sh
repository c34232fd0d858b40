#!/bin/sh
# verify/mpi-fail.sh: failure propagation on the MPI backend. Runs each case of
# verify/test_comm_fail (error, stall, subgroup) as its own 4-process job and
# passes when every rank printed "rank R: case C: ok" and the job ended well
# within its time limit. mpirun's exit code is not the verdict: after the
# expected failure each rank ends with MPI_Abort (dt_mpi_finish(false)), on
# purpose. Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
np=4
# One case takes ~2-3 s (mpirun start-up, the 2 s stall); 60 s means it hung.
# BOUND is the "well within" verdict: a run that needed longer than the
# library's own bounds (10 s per launch) plus start-up is a failure too.
limit=60
bound=30
prog="$sb_top/verify/test_comm_fail"
out="${TMPDIR:-/tmp}/sb-mpi-fail.$$"
trap 'rm -f "$out"' EXIT
status=0
for c in error stall subgroup; do
  echo "== mpirun -np $np test_comm_fail --backend mpi --case $c"
  t0=$(date +%s)
  # sb_mpirun's 300 s is too generous here: the same command, with our limit.
  timeout "$limit" "$MPIRUN" --oversubscribe -np "$np" "$prog" --backend mpi --case "$c" \
    >"$out" 2>&1
  rc=$?
  t1=$(date +%s)
  cat "$out"
  elapsed=$((t1 - t0))
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL: case $c hung (killed after ${limit} s)"
    status=1
    continue
  fi
  if [ "$elapsed" -ge "$bound" ]; then
    echo "FAIL: case $c took ${elapsed} s (bound ${bound} s)"
    status=1
  fi
  r=0
  while [ "$r" -lt "$np" ]; do
    if ! grep -q "^rank $r: case $c: ok" "$out"; then
      echo "FAIL: case $c: rank $r did not report ok"
      status=1
    fi
    r=$((r + 1))
  done
  [ "$status" -eq 0 ] && echo "case $c: all $np ranks ok in ${elapsed} s (mpirun exit $rc)"
done
exit $status
