#!/bin/sh
# verify/mpi-pp.sh: pipeline parallel under mpirun with 4 processes (the MPI backend):
# `shardbench run --backend mpi` of pp (1F1B, the stages' activations and gradients sent
# between processes, DDP over dp_replicate) on pp 2 x dp_replicate 2 and of pp-tp-sp (TP +
# SP inside each stage) on pp 2 x tp 2 and of pp-fsdp (FSDP inside each stage: each unit
# gathered once and reduce-scattered once per step) on pp 2 x dp_shard 2, each verified
# against the unsharded reference (status ok, exit 0). Exits 77 (SKIP) when this build has no MPI (mpi-common.sh).
. "$(dirname "$0")/mpi-common.sh"
sb_mpirun_runs 4 "--model debugmodel:n_layers=2 --dtype f64 --batch 4 --seq 16 --steps 1 --warmup 1" "--plan pp --pp 2 --dp-replicate 2" "--plan pp-tp-sp --pp 2 --tp 2" "--plan pp-fsdp --pp 2 --dp-shard 2"
