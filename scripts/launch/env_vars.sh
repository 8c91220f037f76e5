#!/usr/bin/env bash
# Multi-node training with environment variables only: run this once on every node.
#
#   node 0:  MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NODE_RANK=0 \
#              scripts/launch/env_vars.sh python train.py --devices 2 --num-nodes 2
#   node 1:  ... the same with NODE_RANK=1
#
# (10.0.0.1 stands for node 0's address: use yours.)
#
# Each command starts `devices` processes on its node (AnyDDPStrategy's popen launcher).
# Every node must use the same MASTER_ADDR/MASTER_PORT, devices and num_nodes.
# GLOO_SOCKET_IFNAME is derived from MASTER_ADDR when unset (see docs/scale_out.md).
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0, reachable from every node}"
: "${MASTER_PORT:?set MASTER_PORT to a free TCP port on node 0 (the same on every node)}"
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0 .. num_nodes-1}"
export MASTER_ADDR MASTER_PORT NODE_RANK
exec "$@"
