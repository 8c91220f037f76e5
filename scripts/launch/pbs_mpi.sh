#!/usr/bin/env bash
# Multi-node training on PBS with MPI: `qsub scripts/launch/pbs_mpi.sh` from the repository root.
#
# mpiexec starts one process per device (PPN per node); mpi_env.sh turns the MPI rank variables
# into RANK/LOCAL_RANK/WORLD_SIZE for torch.distributed. Set the select line, queue and account
# for your site (Aurora: -l select=2 -l filesystems=... -A <project> -q <queue>).
#PBS -N anyaccel-digits
#PBS -l select=2
#PBS -l walltime=00:15:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"

# Activate the environment that has your vendor's torch, e.g.:
# source /path/to/venv/bin/activate
NNODES=$(sort -u "${PBS_NODEFILE}" | wc -l)
PPN="${PPN:-2}"                                      # processes (devices) per node
export MASTER_ADDR=$(head -n 1 "${PBS_NODEFILE}")
export MASTER_PORT="${MASTER_PORT:-29500}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

mpiexec -n $(( NNODES * PPN )) -ppn "$PPN" \
    bash scripts/launch/mpi_env.sh \
    python notebooks/scripts/train_digits.py --devices "$PPN" --num-nodes "$NNODES" "$@"
