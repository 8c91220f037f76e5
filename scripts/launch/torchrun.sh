#!/usr/bin/env bash
# Multi-node training with torchrun and the c10d rendezvous: run this once on every node
# (also the entry point of a Kubernetes pod, one pod per node).
#
#   RDZV_HOST=10.0.0.1 RDZV_PORT=29400 NNODES=2 NPROC_PER_NODE=2 \
#     scripts/launch/torchrun.sh train.py --devices 2 --num-nodes 2
#
# (10.0.0.1 stands for node 0's address: use yours.)
#
# torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
# MASTER_PORT for each worker; Lightning's TorchElasticEnvironment reads them.
set -euo pipefail
: "${RDZV_HOST:?set RDZV_HOST to the address of the node that hosts the rendezvous}"
exec "${TORCHRUN:-torchrun}" \
    --nnodes="${NNODES:-2}" \
    --nproc-per-node="${NPROC_PER_NODE:-2}" \
    --rdzv-backend=c10d \
    --rdzv-endpoint="${RDZV_HOST}:${RDZV_PORT:-29400}" \
    --rdzv-id="${RDZV_ID:-lightning-anyaccel}" \
    --rdzv-conf="timeout=${RDZV_TIMEOUT:-300}" \
    --max-restarts=0 \
    "$@"
