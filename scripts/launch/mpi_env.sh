#!/usr/bin/env bash
# Translate the rank variables of an MPI launcher into the ones torch.distributed reads, then
# run the command given. Use it under mpiexec/mpirun (PBS, Aurora/PALS, Open MPI, MPICH, Intel MPI):
#
#   mpiexec -n 4 -ppn 2 bash scripts/launch/mpi_env.sh python notebooks/scripts/train_digits.py --devices 2 --num-nodes 2
#
# With LOCAL_RANK set, Lightning's default LightningEnvironment starts no processes itself: it
# takes the global rank from NODE_RANK * devices + LOCAL_RANK and connects to MASTER_ADDR:MASTER_PORT
# (pbs_mpi.sh sets them from the PBS node file). Ranks are assumed to be placed node by node
# (mpiexec's default). No mpi4py needed.
set -euo pipefail
RANK="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PALS_RANKID:-${PMIX_RANK:-}}}}"
WORLD_SIZE="${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${WORLD_SIZE:-}}}"
LOCAL_RANK="${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${PALS_LOCAL_RANKID:-}}}"
LOCAL_WORLD_SIZE="${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-${PALS_LOCAL_SIZE:-${LOCAL_WORLD_SIZE:-}}}}"
if [[ -z "$RANK" || -z "$WORLD_SIZE" || -z "$LOCAL_RANK" || -z "$LOCAL_WORLD_SIZE" ]]; then
    echo "mpi_env.sh: no MPI rank variables found (is this running under mpiexec?)" >&2
    exit 2
fi
: "${MASTER_ADDR:?set MASTER_ADDR to the first node}" "${MASTER_PORT:=29500}"
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export GROUP_RANK=$(( RANK / LOCAL_WORLD_SIZE ))
export NODE_RANK="$GROUP_RANK"
exec "$@"
