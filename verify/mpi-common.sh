# verify/mpi-common.sh: sourced by the verify/mpi-*.sh drivers.
# Exits 77 (SKIP) when this build has no MPI or no mpirun; defines sb_mpirun NP PROG ARGS.
if [ "${SB_HAVE_MPI:-no}" != yes ] || [ -z "${MPIRUN:-}" ]; then
  echo "SKIP: this build has no MPI backend (configure found no Open MPI)"
  exit 77
fi
if [ "${SB_SANITIZER:-none}" = thread ]; then
  # Open MPI's own threads are not TSan-instrumented: every report would be about
  # its internals, not ours. The threads backend carries the TSan run.
  echo "SKIP: MPI tests are not run under ThreadSanitizer"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Shared-memory transport only: tests run on one machine, with no network.
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
# LeakSanitizer reports Open MPI's own allocations at exit; not ours.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
sb_top=${top_builddir:-.}
sb_mpirun() {
  np=$1; shift
  # timeout: a hung MPI job is a failure, not a stalled suite.
  timeout 300 "$MPIRUN" --oversubscribe -np "$np" "$@"
}
# sb_mpirun_runs NP "FLAGS..." CFG...: `shardbench run --backend mpi CFG FLAGS` under
# mpirun -np NP for each CFG (a string of flags); prints each run's status lines and
# exits 1 when one did not exit 0 with status ok, else 0.
sb_mpirun_runs() {
  np=$1 common=$2
  shift 2
  status=0
  for cfg in "$@"; do
    echo "== mpirun -np $np shardbench run --backend mpi $cfg"
    # shellcheck disable=SC2086 # cfg and common are lists of flags
    out=$(sb_mpirun "$np" "$sb_top/bench/shardbench" run --backend mpi \
      --plans-dir "${srcdir:-.}/plans" $cfg $common 2>&1)
    rc=$?
    echo "$out" | grep -E "status|worst| (cp|pp|dp_shard|dp_shard_cp) "
    if [ $rc -ne 0 ] || ! echo "$out" | grep -q "status: ok"; then
      echo "FAIL: $cfg: exit $rc"
      echo "$out" | tail -5
      status=1
    fi
  done
  exit $status
}
