"""One rank of the all_reduce benchmark (run by :mod:`benchmarks.collective`, 127.0.0.1 only).

Joins a process group with the backend :func:`lightning_anyaccel.resolve_backend` picks for
the device, all-reduces float32 tensors of each size a fixed number of times per trial, and
rank 0 writes the seconds per all_reduce of every trial as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta
from pathlib import Path


def iterations(nbytes: int, budget_bytes: int = 2**27) -> int:
    """All-reduces per trial: many for small messages, at least 3 for the largest."""
    return max(3, min(200, budget_bytes // max(nbytes, 1)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes in bytes")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from benchmarks.common import seconds_per_call
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.device.distributed import prepare_backend

    torch.set_num_threads(args.threads)
    spec = get_spec(runtime.detect_device_type())
    device = spec.device(args.rank)
    runtime.set_device_index(spec, device.index)
    backend = prepare_backend(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, rank=args.rank, world_size=args.world_size, timeout=timedelta(seconds=60),
                            device_id=None if spec.host else device)
    results = []
    for nbytes in (int(s) for s in args.sizes.split(",")):
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        iters = iterations(nbytes)
        for _ in range(2):  # warm-up: connections, buffers
            dist.all_reduce(tensor)
        trials = seconds_per_call(lambda: dist.all_reduce(tensor), device, iters, args.trials,
                                  before_each=dist.barrier)
        results.append({"bytes": tensor.numel() * 4, "iterations": iters, "seconds": trials})
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"backend": backend, "device": str(device), "results": results}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
