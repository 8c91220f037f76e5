#!/usr/bin/env bash
# Multi-node training with mpiexec (Open MPI or MPICH/Intel MPI), run once from any node:
#
#   MASTER_ADDR=10.0.0.1 NNODES=2 PPN=2 scripts/launch/mpiexec.sh python train.py --devices 2 --num-nodes 2
#
# (10.0.0.1 stands for the first node's address: use yours.)
# AnyDDPStrategy switches to AnyMPIEnvironment, which reads each launcher's rank variables
# (no mpi4py needed). Host lists come from your scheduler or MPIEXEC_EXTRA_ARGS (e.g. "-H a:2,b:2").
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
MPIEXEC="${MPIEXEC:-mpiexec}"
NNODES="${NNODES:-2}"
PPN="${PPN:-2}"
read -r -a extra <<< "${MPIEXEC_EXTRA_ARGS:-}"
if "$MPIEXEC" --version 2>&1 | grep -qi "open mpi\|openrte"; then
    # Open MPI: pass the rendezvous variables to remote ranks explicitly.
    exec "$MPIEXEC" -n $((NNODES * PPN)) --npernode "$PPN" -x MASTER_ADDR -x MASTER_PORT \
        -x PYTHONPATH -x OMP_NUM_THREADS "${extra[@]}" "$@"
else
    # MPICH / Hydra, Intel MPI: the whole environment is forwarded by default.
    exec "$MPIEXEC" -n $((NNODES * PPN)) -ppn "$PPN" "${extra[@]}" "$@"
fi
