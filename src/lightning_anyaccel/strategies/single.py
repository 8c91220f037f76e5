"""``AnySingleDeviceStrategy``: train on one device of any type (Trainer).

Lightning's connector gives any accelerator other than CUDA/MPS a ``SingleDeviceStrategy("cpu")``
when one device is requested, so the model silently trains on CPU. This strategy takes its
device from the accelerator instead (``devices=[1]`` -> ``xpu:1``). The behaviour lives in
:class:`~lightning_anyaccel.strategies.common.LazyDeviceMixin`, shared with Fabric's
:class:`lightning_anyaccel.fabric.AnySingleDeviceStrategy`.

Example:
    >>> from lightning import Trainer
    >>> from lightning_anyaccel import AnyAccelerator
    >>> trainer = Trainer(accelerator=AnyAccelerator("cpu"), strategy="any_single", devices=1, logger=False)
    >>> trainer.strategy.root_device
    device(type='cpu')
"""

from __future__ import annotations

from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_anyaccel.strategies.common import LazyDeviceMixin, TrainerParameterMovesMixin


class AnySingleDeviceStrategy(TrainerParameterMovesMixin, LazyDeviceMixin, SingleDeviceStrategy):
    """One process, one device; the device comes from the accelerator unless given.

    Args:
        device: a device such as ``"xpu:1"``; ``None`` (default) takes the device selected by
            the Trainer's ``accelerator`` and ``devices``.
        accelerator, checkpoint_io, precision_plugin: as for Lightning's ``SingleDeviceStrategy``.
    """

    strategy_name = "any_single"

