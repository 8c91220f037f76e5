"""The DeepSpeed family's own setup steps: what DeepSpeed needs chosen and checked on the device type.

Whether DeepSpeed trains on a device type is one rule,
:func:`~lightning_anyaccel.strategies.support.deepspeed_support`, which the
strategies, the tools and the documentation ask: DeepSpeed's own accelerator list
(``SUPPORTED_ACCELERATOR_LIST``) and its own probe (the vendor package its accelerator imports).
DeepSpeed picks its accelerator once per process (``DS_ACCELERATOR``, else its own guess) and
imports the vendor's package for it; :func:`select_deepspeed_accelerator` and
:func:`check_deepspeed_support` settle both before any worker starts,
:func:`check_active_deepspeed_accelerator` checks DeepSpeed's choice once it made it, and
:func:`check_inference_support` the Trainer's inference settings. Each step is typed against the
protocol of what it may use of the strategy (:class:`DeepSpeedTarget`); the family's module
(:mod:`lightning_anyaccel.strategies.deepspeed`) lists them in its ``SETUP``.

Example:
    >>> from lightning_anyaccel.device.devices import get_spec
    >>> deepspeed_support(get_spec("musa"), probe=False).supported
    False
"""

from __future__ import annotations

import functools
import os
from typing import Any, Protocol

from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.strategies.errors import ShardingNotSupportedError
from lightning_anyaccel.strategies.steps import ShardedTarget
from lightning_anyaccel.strategies.support import deepspeed_support

#: The ``DS_ACCELERATOR`` values the package set in this process (a user's own value is never in it).
_DS_ACCELERATOR_SET: set[str] = set()


@functools.cache
def inference_config_keys() -> frozenset[str]:
    """The keys of DeepSpeed's inference configuration (``deepspeed.init_inference``), asked from DeepSpeed.

    >>> {"tensor_parallel", "dtype", "replace_with_kernel_inject"} <= inference_config_keys()
    True
    """
    import deepspeed

    return frozenset(deepspeed.default_inference_config())


# ----- the family's own steps ---------------------------------------------------------------------


class DeepSpeedTarget(ShardedTarget, Protocol):
    """What the DeepSpeed family's steps may use of the strategy (:class:`AnyDeepSpeedMixin`)."""

    @property
    def deepspeed_accelerator(self) -> str:
        """The device type's name in DeepSpeed's accelerator layer."""
        ...


class DeepSpeedTrainerTarget(DeepSpeedTarget, Protocol):
    """What the Trainer's inference check may use of the strategy (:class:`AnyDeepSpeedStrategy`)."""

    inference_kwargs: dict[str, Any]


def select_deepspeed_accelerator(strategy: DeepSpeedTarget) -> None:
    """Make DeepSpeed use the strategy's device type (``DS_ACCELERATOR``), or refuse a conflicting choice.

    First of the family's steps: "DeepSpeed does not run here" beats a backend message. A value
    the package itself set for an earlier strategy in this process is replaced; a value set by the
    user is respected (and refused when it names another device type). Whether DeepSpeed already
    chose another accelerator in this process is checked after setup
    (:func:`check_active_deepspeed_accelerator`).
    """
    name = strategy.deepspeed_accelerator
    chosen = os.environ.get("DS_ACCELERATOR")
    if chosen and chosen != name and chosen not in _DS_ACCELERATOR_SET:
        raise ShardingNotSupportedError(
            f"DS_ACCELERATOR={chosen!r} is set, but the strategy trains on {strategy.device_type!r}."
            f" Unset DS_ACCELERATOR or set it to {name!r}."
        )
    os.environ["DS_ACCELERATOR"] = name  # inherited by the processes the launcher starts
    _DS_ACCELERATOR_SET.add(name)


def check_deepspeed_support(strategy: DeepSpeedTarget) -> None:
    """Refuse, before any process starts, a device type DeepSpeed does not run on here (:func:`deepspeed_support`).

    Without it, DeepSpeed stops in every worker ("NPU_Accelerator requires torch_npu") once
    ``DS_ACCELERATOR`` names the device type, and without ``DS_ACCELERATOR`` picks its CPU
    accelerator: its distributed start-up then compiles its shared-memory op for minutes while the
    other ranks wait without a word, and it treats the device's tensors as CPU tensors.
    """
    support = deepspeed_support(get_spec(strategy.device_type))
    if not support.supported:
        raise ShardingNotSupportedError(support.reason)


def check_active_deepspeed_accelerator(strategy: DeepSpeedTarget) -> None:
    """After setup: refuse a DeepSpeed that already picked another accelerator in this process."""
    from deepspeed.accelerator import get_accelerator

    active = get_accelerator().device_name()
    if active != strategy.deepspeed_accelerator:
        raise ShardingNotSupportedError(
            f"DeepSpeed already chose its {active!r} accelerator in this process, but the strategy trains on"
            f" {strategy.device_type!r}. Set DS_ACCELERATOR={strategy.deepspeed_accelerator} before importing deepspeed."
        )


def check_inference_support(strategy: DeepSpeedTrainerTarget) -> None:
    """Trainer: refuse kernel injection where DeepSpeed has no inference kernels for the device (cuda, hpu have them).

    Raises:
        ShardingNotSupportedError: ``replace_with_kernel_inject=True`` without DeepSpeed's
            ``InferenceBuilder`` for the device, naming the setting that runs (automatic
            tensor parallelism, ``replace_with_kernel_inject=False``).
    """
    if not strategy.inference_kwargs.get("replace_with_kernel_inject"):
        return
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("InferenceBuilder")  # hpu, cuda: yes; cpu: NotImplementedBuilder
    if builder is None or type(builder).__name__ == "NotImplementedBuilder" or not builder.is_compatible(False):
        raise ShardingNotSupportedError(
            f"replace_with_kernel_inject=True needs DeepSpeed's inference kernels, which DeepSpeed does not have"
            f" for {strategy.device_type!r} (its {get_accelerator().device_name()!r} accelerator). Pass"
            " replace_with_kernel_inject=False: DeepSpeed then splits the model's linear layers across"
            " tensor_parallel={'tp_size': N} ranks without custom kernels (automatic tensor parallelism)."
        )


__all__ = ["DeepSpeedTarget", "DeepSpeedTrainerTarget", "check_active_deepspeed_accelerator", "check_deepspeed_support",
           "check_inference_support", "inference_config_keys", "select_deepspeed_accelerator"]
