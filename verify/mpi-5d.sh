#!/bin/sh
# verify/mpi-5d.sh: all five dims under mpirun with 32 processes (the MPI backend):
# `shardbench run --backend mpi` of plans/torchtitan-5d.plan on pp 2, dp_replicate 2,
# dp_shard 2, cp 2, tp 2 (pipeline sends, the context-parallel ring and every collective
# between processes), verified against the unsharded reference (status ok, exit 0).
# verify/five-d.sh checks the same config's counts on the threads backend. Exits 77
# (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
sb_mpirun_runs 32 "--batch 8 --seq 16 --steps 1 --warmup 1 --dtype f64" \
  "--plan torchtitan-5d --pp 2 --dp-replicate 2 --dp-shard 2 --cp 2 --tp 2"
