#!/bin/sh
# verify/mpi-cp.sh: context parallel under mpirun with 4 processes (the MPI backend):
# `shardbench run --backend mpi` of fsdp-tp-cp (the pass-KV ring's send/recv between
# processes, FSDP over the flattened dp_shard_cp communicator, TP + SP) on cp 2 x tp 2
# and of fsdp-cp (K and V all-gathered over cp) on dp_shard 2 x cp 2, each verified
# against the unsharded reference (status ok, exit 0). Exits 77 (SKIP) when this build
# has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
sb_mpirun_runs 4 "--model debugmodel:n_layers=2 --dtype f64 --batch 4 --seq 32 --steps 1 --warmup 1" "--plan fsdp-tp-cp --cp 2 --tp 2" "--plan fsdp-cp --dp-shard 2 --cp 2"
