"""The emulated device's collective backend: real collectives between processes on device tensors.

Each collective copies the device tensors to host tensors, runs the same collective over a gloo
process group built on the store ``init_process_group`` gave the backend, and copies the results
back into the device tensors. Data really moves between processes; what this can not show is a
vendor library's behaviour (its algorithms, its streams, its failures).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

ReduceOp = dist.ReduceOp


def _done(result: Any) -> Any:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.detach().to("cpu")


def _back(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.device.type != "cpu" or dst.data_ptr() != src.data_ptr():
        with torch.no_grad():
            dst.copy_(src)


def _op_and_divisor(op: Any, world: int) -> tuple[Any, int]:
    """gloo has no AVG: sum, then divide."""
    if op == ReduceOp.AVG:
        return ReduceOp.SUM, world
    return op, 1


class EmulatorProcessGroup(dist.ProcessGroup):
    """A Python process group whose collectives accept device tensors of the emulated type."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, device_type: str, name: str) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._rank, self._size = rank, size
        self._device_type = device_type
        self._name = name
        # torch asks the group for its backend object per device type (`_get_backend`, e.g. when
        # init_process_group gets a `device_id`): answer with the gloo transport underneath.
        self._register_backend(torch.device(device_type), dist.ProcessGroup.BackendType.CUSTOM, self._gloo)
        # ... and name that backend the group's default, as torch does for the groups it builds from
        # a registered backend: torch >= 2.15 attaches its flight recorder to every new group and
        # looks the group up through its default backend ("Could not find the default backend type").
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    # identity
    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return self._name

    def name(self) -> str:
        return self._name

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def _reduce(self, tensors: Sequence[torch.Tensor], op: Any) -> None:
        real_op, divisor = _op_and_divisor(op, self._size)
        hosts = [_host(t) for t in tensors]
        opts = dist.AllreduceOptions()
        opts.reduceOp = real_op
        self._gloo.allreduce(hosts, opts).wait()
        for t, h in zip(tensors, hosts):
            if divisor != 1:
                h = h / divisor if h.is_floating_point() else h // divisor
            _back(t, h)

    # collectives (the names and signatures c10d's Python API calls on a ProcessGroup)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None and not isinstance(opts, type(ReduceOp.SUM)) else (opts or ReduceOp.SUM)
        self._reduce(tensors, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._reduce(tensors, opts.reduceOp if opts is not None else ReduceOp.SUM)
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        hosts = [_host(t).clone() for t in tensors]
        self._reduce(hosts, opts.reduceOp)
        if self._rank == opts.rootRank:
            for t, h in zip(tensors, hosts):
                _back(t, h)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        hosts = [_host(t) for t in tensors]
        self._gloo.broadcast(hosts, opts).wait()
        for t, h in zip(tensors, hosts):
            _back(t, h)
        return _done(tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        host_out = [[_host(o).clone() for o in outs] for outs in output_lists]
        self._gloo.allgather(host_out, [_host(i) for i in inputs]).wait()
        for outs, hosts in zip(output_lists, host_out):
            for o, h in zip(outs, hosts):
                _back(o, h)
        return _done(output_lists)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        chunks = [torch.empty_like(_host(input)) for _ in range(self._size)]
        self._gloo.allgather([chunks], [_host(input)]).wait()
        _back(output, torch.cat([c.reshape(-1) for c in chunks]).reshape(output.shape))
        return _done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self._allgather_base(o, i, opts)
        return _done(outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        for out, inputs in zip(outputs, input_lists):
            stacked = torch.stack([_host(i) for i in inputs]).clone()
            self._reduce([stacked], opts.reduceOp)
            _back(out, stacked[self._rank])
        return _done(outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        full = _host(input).clone()
        self._reduce([full], opts.reduceOp)
        _back(output, full.reshape(self._size, -1)[self._rank].reshape(output.shape))
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        for o, i in zip(outputs, inputs):
            self._reduce_scatter_base(o, i, opts)
        return _done(outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        host_out = [[_host(o).clone() for o in outs] for outs in output_lists]
        self._gloo.gather(host_out, [_host(i) for i in inputs], opts).wait()
        for outs, hosts in zip(output_lists, host_out):
            for o, h in zip(outs, hosts):
                _back(o, h)
        return _done(output_lists)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        hosts = [_host(o).clone() for o in outputs]
        self._gloo.scatter(hosts, [[_host(i) for i in inputs] for inputs in input_lists], opts).wait()
        for o, h in zip(outputs, hosts):
            _back(o, h)
        return _done(outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any) -> Any:
        host_out = _host(output).clone()
        self._gloo.alltoall_base(host_out, _host(input), output_split_sizes, input_split_sizes, opts).wait()
        _back(output, host_out)
        return _done([output])

    all_to_all_single = alltoall_base

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self._gloo.send([_host(t) for t in tensors], dst, tag).wait()
        return _done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        hosts = [_host(t).clone() for t in tensors]
        self._gloo.recv(hosts, src, tag).wait()
        for t, h in zip(tensors, hosts):
            _back(t, h)
        return _done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        self._gloo.barrier(dist.BarrierOptions()).wait()
        return _done(None)


def make_creator(device_type: str, name: str) -> Callable[..., EmulatorProcessGroup]:
    """The creator function ``Backend.register_backend`` wants: ``(store, rank, size, timeout)``."""

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatorProcessGroup:
        return EmulatorProcessGroup(store, rank, size, timeout, device_type, name)

    create.__name__ = f"create_{name}"
    return create
