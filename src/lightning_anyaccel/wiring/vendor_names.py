"""The vendor plugins' strategy names: each trains as the package's strategy of its family, on the device type it names.

lightning-habana registers ``hpu_single``, ``hpu_ddp``, ``hpu_parallel``, ``hpu_fsdp``, ``hpu_deepspeed_stage_2``, ...
(and ``single_hpu`` for Fabric), lightning-teco ``single_sdaa``, ``dpp_sdaa``, ``ddp_sdaa_find_unused_parameters_false``,
``sdaa_fsdp``, ``sdaa_deepspeed_stage_2``, ...: a device type of the device table joined by ``_`` to a strategy word.
The word is one of Lightning's names the package replaces (:data:`~lightning_anyaccel.strategies.families.EQUIVALENTS`)
or a family's word (:data:`~lightning_anyaccel.strategies.families.FAMILY_WORDS`), so the vocabulary is the family
table's. The vendor's strategy brought its own accelerator, so the name picks the device type too:

- with ``accelerator="auto"`` (or none) the Trainer or Fabric trains on that device type, with the package's strategy,
  said once in the log;
- with an accelerator of that type, the same;
- with any other accelerator, or a name of a device type whose word is no strategy here
  (``hpu_deepspeed_stage_3_offload_nvme``), a :class:`~lightning_anyaccel.wiring.errors.StrategyNotSupportedError`
  naming the package's spelling.

A name some installed plugin registered itself (lightning-habana installed beside the package) is left to it.

Example:
    >>> vendor_strategy("hpu_parallel"), vendor_strategy("ddp_sdaa_find_unused_parameters_false")
    (('hpu', 'any_ddp'), ('sdaa', 'any_ddp'))
    >>> vendor_strategy("single_hpu"), vendor_strategy("sdaa_deepspeed_stage_3_offload")
    (('hpu', 'any_single'), ('sdaa', 'any_deepspeed_stage_3_offload'))
    >>> vendor_strategy("ddp") is None, vendor_strategy("hpu_nvme"), vendor_strategy("hpu") is None
    (True, ('hpu', None), True)
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from lightning_anyaccel.device.devices import known_device_types
from lightning_anyaccel.strategies.families import EQUIVALENTS, FAMILIES, FAMILY_WORDS
from lightning_anyaccel.wiring.errors import StrategyNotSupportedError

log = logging.getLogger(__name__)


def vendor_strategy(name: str) -> tuple[str, str | None] | None:
    """``(device type, the package's registered name)`` for a vendor plugin's strategy name, else ``None``.

    The name is ``None`` where ``name`` joins a device type to a word that is no strategy here.
    """
    words = name.lower().split("_")
    types = set(known_device_types())
    for i, word in enumerate(words):
        if word in types and len(words) > 1:
            rest = "_".join(words[:i] + words[i + 1:])
            return word, EQUIVALENTS.get(rest) or FAMILY_WORDS.get(rest)
    return None


def _accelerator_type(accelerator: Any) -> str | None:
    """The device type an ``accelerator=`` flag names (a name or an accelerator object), ``None`` for ``"auto"``."""
    if accelerator is None or accelerator == "auto":
        return None
    if isinstance(accelerator, str):
        return accelerator
    return str(getattr(accelerator, "device_type", type(accelerator).__name__))


def rename(flags: dict[str, Any], registered: Collection[str]) -> None:
    """Replace a vendor plugin's ``strategy`` name in the connector's ``flags`` by the package's (see the module).

    Raises:
        StrategyNotSupportedError: the name's device type is not the accelerator's, or its word is no strategy here.
    """
    strategy = flags.get("strategy")
    if not isinstance(strategy, str) or strategy.lower() in registered:
        return
    found = vendor_strategy(strategy)
    if found is None:
        return
    device_type, ours = found
    given = _accelerator_type(flags.get("accelerator"))
    if ours is None:
        names = ", ".join(repr(family.own_name) for family in FAMILIES)
        raise StrategyNotSupportedError(
            f"strategy={strategy!r} is not a strategy of lightning-anyaccel: with accelerator={device_type!r}, pass"
            f" one of {names} or a Lightning name they replace ('ddp', 'fsdp', 'deepspeed_stage_3_offload', ...).")
    if given not in (None, device_type):
        raise StrategyNotSupportedError(
            f"strategy={strategy!r} (a vendor plugin's name) trains on {device_type!r}, but the accelerator is"
            f" {given!r}. Pass strategy={ours!r} to train on {given!r}, or accelerator={device_type!r}.")
    flags["strategy"] = ours
    if given is None:
        flags["accelerator"] = device_type
    log.info("lightning-anyaccel: strategy=%r (a vendor plugin's name) trains as the package's %r on %r.",
             strategy, ours, device_type)


__all__ = ["rename", "vendor_strategy"]
