"""The emulated device's collective backend: real, asynchronous collectives between processes on device tensors.

A collective copies its device inputs to host tensors when it is called, starts the same collective
over a gloo process group (built on the store ``init_process_group`` gave the backend) and returns
at once, as a vendor library returns once its kernel is queued. The result lands in the device
tensors when the work *completes*: at ``work.wait()`` (what ``async_op=False`` does for the caller),
or, once ``work.get_future()`` was asked for (DDP's comm hooks), when a background thread has seen
gloo finish. Until then the device tensors hold what they held before the call, so code that reads a
result without waiting reads the old value here, where hardware would give it whatever the
collective's stream wrote so far. The works of a group complete in the order they were issued (one
communication stream): waiting for one completes those issued before it.

Data really moves between processes; what this can not show is a vendor library's behaviour (its
algorithms, its streams, its failures). Options of the emulator (``lightning_anyaccel/kit/emulator/names.py``):
``noavg`` makes the backend refuse ``ReduceOp.AVG`` at the call, as some vendors' libraries do.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

ReduceOp = dist.ReduceOp

#: Called with each work when it is issued (the run command's report notes where: ``problems.py``).
on_issue: Callable[[EmulatedWork], None] | None = None
#: Every group's stream of works, to find at exit the works nobody waited for (:func:`pending_works`).
_streams: weakref.WeakSet[_Stream] = weakref.WeakSet()


def pending_works() -> list[EmulatedWork]:
    """The works issued and never completed: nobody waited for them, nor for a work issued after them."""
    return [work for stream in list(_streams) for work in list(stream._pending) if not work.done]


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t``, taken now: later writes to ``t`` do not change what the collective sends."""
    return t.detach().to("cpu", copy=True)


def _land(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():
        dst.copy_(src)


class _Stream:
    """The works of one group, completed in the order they were issued (by whichever thread asks first)."""

    def __init__(self) -> None:
        self._pending: deque[EmulatedWork] = deque()
        self._cond = threading.Condition()
        self._busy = False  # a thread is completing the work at the head
        _streams.add(self)

    def issue(self, work: EmulatedWork) -> None:
        with self._cond:
            self._pending.append(work)

    def complete_through(self, work: EmulatedWork) -> None:
        """Complete every work issued up to ``work`` (each one's gloo transfer is bounded by the group's timeout)."""
        while True:
            with self._cond:
                while self._busy and not work.done:
                    self._cond.wait()
                if work.done:
                    return
                self._busy = True
                head = self._pending.popleft()
            try:
                head._complete()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class EmulatedWork(Work):
    """A collective in flight: gloo moves the host copies now; the device tensors get the result at completion."""

    def __init__(self, stream: _Stream, transfers: Sequence[Any], land: Callable[[], None] | None, result: Any) -> None:
        super().__init__()
        self._stream = stream
        self._transfers: Sequence[Any] = transfers
        self._land_result = land
        self._result = result
        self._future: torch.futures.Future = torch.futures.Future()
        self._error: BaseException | None = None
        stream.issue(self)
        if on_issue is not None:
            on_issue(self)

    @property
    def done(self) -> bool:
        return self._future.done()

    def _complete(self) -> None:
        try:
            for transfer in self._transfers:
                transfer.wait()
            if self._land_result is not None:
                self._land_result()
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits
            self._error = err
            self._future.set_exception(err)
        else:
            self._future.set_result(self._result)
        finally:
            self._transfers, self._land_result = (), None

    # the Work API (torch.distributed calls these on what a collective returns)
    def wait(self, timeout: timedelta | None = None) -> bool:
        self._stream.complete_through(self)
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        if not self.done:
            threading.Thread(target=self._stream.complete_through, args=(self,), daemon=True,
                             name="emulated-collective").start()
        return self._future

    def is_completed(self) -> bool:
        return self.done

    def is_success(self) -> bool:
        return self.done and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> Any:
        self.wait()
        return self._result


class EmulatorProcessGroup(dist.ProcessGroup):
    """A Python process group whose collectives accept device tensors of the emulated type."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, device_type: str, name: str,
                 avg: bool = True) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._rank, self._size = rank, size
        self._device_type = device_type
        self._name = name
        self._avg = avg
        self._stream = _Stream()
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

    def _work(self, transfers: Sequence[Any], land: Callable[[], None] | None, result: Any) -> EmulatedWork:
        return EmulatedWork(self._stream, transfers, land, result)

    def _op_and_divisor(self, op: Any) -> tuple[Any, int]:
        """gloo has no AVG: sum, then divide (or refuse it, as a backend without AVG does: option ``noavg``)."""
        if op == ReduceOp.AVG:
            if not self._avg:
                raise RuntimeError(f"{self._name}: ReduceOp.AVG is not supported by this backend; reduce with"
                                   " ReduceOp.SUM and divide by the group's size")
            return ReduceOp.SUM, self._size
        return op, 1

    def _allreduce_hosts(self, hosts: list[torch.Tensor], op: Any) -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]]:
        """Start an all-reduce of ``hosts`` (in place); return the transfer and what turns a host result into the answer."""
        real_op, divisor = self._op_and_divisor(op)
        opts = dist.AllreduceOptions()
        opts.reduceOp = real_op
        transfer = self._gloo.allreduce(hosts, opts)
        if divisor == 1:
            return transfer, lambda h: h
        return transfer, lambda h: h / divisor if h.is_floating_point() else h // divisor

    def _allreduce(self, tensors: list[torch.Tensor], op: Any) -> EmulatedWork:
        hosts = [_host(t) for t in tensors]
        transfer, finish = self._allreduce_hosts(hosts, op)

        def land() -> None:
            for t, h in zip(tensors, hosts):
                _land(t, finish(h))

        return self._work([transfer], land, tensors)

    # collectives (the names and signatures c10d's Python API calls on a ProcessGroup)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = opts.reduceOp if opts is not None and not isinstance(opts, type(ReduceOp.SUM)) else (opts or ReduceOp.SUM)
        return self._allreduce(tensors, op)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._allreduce(tensors, opts.reduceOp if opts is not None else ReduceOp.SUM)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        hosts = [_host(t) for t in tensors]
        transfer, finish = self._allreduce_hosts(hosts, opts.reduceOp)

        def land() -> None:
            if self._rank == opts.rootRank:
                for t, h in zip(tensors, hosts):
                    _land(t, finish(h))

        return self._work([transfer], land, tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        hosts = [_host(t) for t in tensors]
        transfer = self._gloo.broadcast(hosts, opts)

        def land() -> None:
            for t, h in zip(tensors, hosts):
                _land(t, h)

        return self._work([transfer], land, tensors)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        host_out = [[_host(o) for o in outs] for outs in output_lists]
        transfer = self._gloo.allgather(host_out, [_host(i) for i in inputs])

        def land() -> None:
            for outs, hosts in zip(output_lists, host_out):
                for o, h in zip(outs, hosts):
                    _land(o, h)

        return self._work([transfer], land, output_lists)

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor) -> tuple[Any, Callable[[], None]]:
        host_in = _host(input)
        chunks = [torch.empty_like(host_in) for _ in range(self._size)]
        transfer = self._gloo.allgather([chunks], [host_in])
        return transfer, lambda: _land(output, torch.cat([c.reshape(-1) for c in chunks]).reshape(output.shape))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        transfer, land = self._gather_into(output, input)
        return self._work([transfer], land, [output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        started = [self._gather_into(o, i) for o, i in zip(outputs, inputs)]

        def land() -> None:
            for _, land_one in started:
                land_one()

        return self._work([transfer for transfer, _ in started], land, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _scatter_reduced(self, output: torch.Tensor, full: torch.Tensor, op: Any) -> tuple[Any, Callable[[], None]]:
        """All-reduce ``full`` (a host tensor, one slice per rank along dim 0); land this rank's slice in ``output``."""
        transfer, finish = self._allreduce_hosts([full], op)
        return transfer, lambda: _land(output, finish(full.reshape(self._size, -1)[self._rank]).reshape(output.shape))

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        started = [self._scatter_reduced(out, torch.stack([_host(i) for i in inputs]), opts.reduceOp)
                   for out, inputs in zip(outputs, input_lists)]

        def land() -> None:
            for _, land_one in started:
                land_one()

        return self._work([transfer for transfer, _ in started], land, outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        transfer, land = self._scatter_reduced(output, _host(input), opts.reduceOp)
        return self._work([transfer], land, [output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> Any:
        started = [self._scatter_reduced(o, _host(i), opts.reduceOp) for o, i in zip(outputs, inputs)]

        def land() -> None:
            for _, land_one in started:
                land_one()

        return self._work([transfer for transfer, _ in started], land, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> Any:
        host_out = [[_host(o) for o in outs] for outs in output_lists]
        transfer = self._gloo.gather(host_out, [_host(i) for i in inputs], opts)

        def land() -> None:
            for outs, hosts in zip(output_lists, host_out):
                for o, h in zip(outs, hosts):
                    _land(o, h)

        return self._work([transfer], land, output_lists)

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any) -> Any:
        hosts = [_host(o) for o in outputs]
        transfer = self._gloo.scatter(hosts, [[_host(i) for i in inputs] for inputs in input_lists], opts)

        def land() -> None:
            for o, h in zip(outputs, hosts):
                _land(o, h)

        return self._work([transfer], land, outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any) -> Any:
        host_out = _host(output)
        transfer = self._gloo.alltoall_base(host_out, _host(input), output_split_sizes, input_split_sizes, opts)
        return self._work([transfer], lambda: _land(output, host_out), [output])

    all_to_all_single = alltoall_base

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        return self._work([self._gloo.send([_host(t) for t in tensors], dst, tag)], None, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        hosts = [_host(t) for t in tensors]
        transfer = self._gloo.recv(hosts, src, tag)

        def land() -> None:
            for t, h in zip(tensors, hosts):
                _land(t, h)

        return self._work([transfer], land, tensors)

    def barrier(self, opts: Any = None) -> Any:
        return self._work([self._gloo.barrier(dist.BarrierOptions())], None, None)


def make_creator(device_type: str, name: str, avg: bool = True) -> Callable[..., EmulatorProcessGroup]:
    """The creator function ``Backend.register_backend`` wants: ``(store, rank, size, timeout)``.

    ``avg=False`` (the emulator's ``noavg`` option): the groups refuse ``ReduceOp.AVG``.
    """

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatorProcessGroup:
        return EmulatorProcessGroup(store, rank, size, timeout, device_type, name, avg=avg)

    create.__name__ = f"create_{name}"
    return create
