#!/bin/sh
# verify/mpi-fsdp.sh: FSDP under mpirun with 4 processes (the MPI backend):
# `shardbench run --backend mpi` of fsdp-tp-sp on dp_shard 2 x tp 2 (the mesh's
# tp-before-dp_shard order is a split of MPI's world communicator) and of zero1 on
# dp_replicate 2 x dp_shard 2, each verified against the unsharded reference
# (status ok, exit 0). Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
sb_mpirun_runs 4 "--dtype f64 --batch 8 --seq 16 --steps 1 --warmup 1" "--plan fsdp-tp-sp --dp-shard 2 --tp 2" "--plan zero1 --dp-replicate 2 --dp-shard 2"
