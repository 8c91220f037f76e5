#!/usr/bin/env bash
# Multi-node training with torchrun: run this same script once on every node.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0.example MASTER_PORT=29500 bash scripts/launch/torchrun.sh   # on node 0
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0.example MASTER_PORT=29500 bash scripts/launch/torchrun.sh   # on node 1
#
# torchrun starts NPROC_PER_NODE processes per node and sets RANK, LOCAL_RANK, WORLD_SIZE,
# GROUP_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each; Lightning reads them
# (TorchElasticEnvironment), so the Trainer needs only devices=NPROC_PER_NODE, num_nodes=NNODES.
# Extra arguments go to the training script. The multi-node notebook runs this file with two
# "nodes" on 127.0.0.1.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
: "${NNODES:=2}" "${NPROC_PER_NODE:=2}" "${NODE_RANK:?set NODE_RANK (0 .. NNODES-1)}"
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}" "${MASTER_PORT:=29500}"
PYTHON="${PYTHON:-python}"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$ROOT/notebooks/scripts/train_digits.py}"

exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --nproc-per-node="$NPROC_PER_NODE" --node-rank="$NODE_RANK" \
    --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \
    "$TRAIN_SCRIPT" --devices "$NPROC_PER_NODE" --num-nodes "$NNODES" "$@"
