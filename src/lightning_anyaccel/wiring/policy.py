"""Which strategy trains with the package's accelerator: one policy for the Trainer and for Fabric.

Users coming from the vendor plugins write ``Trainer(accelerator="hpu", devices=8)`` with no
strategy, or ``strategy="ddp"``. Lightning would give any accelerator that is not CUDA/MPS a
``SingleDeviceStrategy("cpu")`` (the model trains on CPU) or its CUDA-minded ``DDPStrategy``.
With the package's accelerator (``"any"``, ``"xpu"``, ... or an ``AnyAccelerator`` instance):

- **no strategy** (``"auto"``): one device -> ``any_single``; several devices or nodes ->
  ``any_ddp`` (``any_ddp_notebook`` in a notebook or another interactive session);
- **a Lightning strategy name** (``"ddp"``, ``"fsdp"``, ``"deepspeed_stage_2"``, ...): the package's
  equivalent of :data:`EQUIVALENTS`, said once in the log. The name says what the user wants
  and the package's strategy takes the same arguments, so a refusal would only make them edit
  every script;
- **a Lightning strategy instance** (``DDPStrategy(...)``): refused on device types Lightning does
  not support, with the class to use. Such an instance may be a user's subclass or carry state
  that can not be moved to another class safely. On ``cpu``, ``cuda`` and ``mps``, where
  Lightning's own strategies work, it is kept, with its precision plugin moved to the device type.
  Where the package is put to work for a program you don't edit (``LIGHTNING_ANYACCEL_ACTIVATE=1``,
  :mod:`lightning_anyaccel.wiring.activation`), an instance of exactly Lightning's ``DDPStrategy``,
  ``FSDPStrategy``, ``ModelParallelStrategy`` or ``DeepSpeedStrategy`` is rebuilt as the package's
  strategy with the same arguments instead (said in the log): such programs build them
  themselves, and their users can not edit that line.

``accelerator="auto"`` (the default) takes the device torch reports with the package's
accelerator (:mod:`lightning_anyaccel.wiring.auto`), and then everything above applies.

CUDA/MPS/CPU users who don't use the package's accelerator see no change: the connectors run
Lightning's code for every other accelerator (see :func:`lightning_anyaccel._lightning.install_connector_hooks`).

Example:
    >>> EQUIVALENTS["ddp"], EQUIVALENTS["deepspeed_stage_2"]
    ('any_ddp', 'any_deepspeed_stage_2')
    >>> default_strategy(num_devices=1, num_nodes=1, interactive=False)
    'any_single'
    >>> default_strategy(num_devices=8, num_nodes=1, interactive=True)
    'any_ddp_notebook'
"""

from __future__ import annotations

import logging
from typing import Any

from lightning_anyaccel import _lightning
from lightning_anyaccel.device.devices import get_spec, is_host
from lightning_anyaccel.device.precision import align_precision_plugin
from lightning_anyaccel.strategies.families import CLASS_EQUIVALENTS, EQUIVALENTS
from lightning_anyaccel.wiring import activation, auto, vendor_names
from lightning_anyaccel.wiring.errors import FrontEndMismatchError, StrategyNotSupportedError

log = logging.getLogger(__name__)

def default_strategy(num_devices: int, num_nodes: int, interactive: bool) -> str:
    """The package's strategy for ``strategy="auto"``: ``any_single``, ``any_ddp`` or ``any_ddp_notebook``."""
    if num_devices <= 1 and num_nodes <= 1:
        return "any_single"
    return "any_ddp_notebook" if interactive else "any_ddp"


def owns(accelerator: Any) -> bool:
    """Whether ``accelerator`` is the package's (an ``AnyAccelerator`` of either front end)."""
    from lightning_anyaccel.accelerator import AnyAcceleratorMixin

    return isinstance(accelerator, AnyAcceleratorMixin)


def choose(view: _lightning.ConnectorView) -> str:
    """``strategy="auto"`` with the package's accelerator (see :func:`default_strategy`)."""
    name = default_strategy(view.num_devices, view.num_nodes, _lightning.is_interactive())
    log.debug("lightning-anyaccel: strategy='auto' with %r -> %r", view.accelerator, name)
    return name


def translate(view: _lightning.ConnectorView) -> None:
    """Replace a Lightning strategy name by the package's equivalent (:data:`EQUIVALENTS`); refuse instances early.

    Runs before Lightning's own fallbacks, which refuse FSDP for every accelerator but CUDA.
    """
    flag = view.strategy_flag
    if isinstance(flag, str) and flag in EQUIVALENTS:
        view.strategy_flag = EQUIVALENTS[flag]
        log.info(
            "lightning-anyaccel: strategy=%r with %r uses the package's %r (the same strategy on the"
            " accelerator's device type).", flag, view.accelerator, view.strategy_flag,
        )
    elif not isinstance(flag, str):
        rebuilt = _rebuilt_for_program(flag, view.accelerator)
        if rebuilt is None:
            _refuse_foreign(flag, view.accelerator)
        else:
            view.strategy_flag = rebuilt


def _rebuilt_for_program(strategy: Any, accelerator: Any) -> Any:
    """The package's strategy built with the arguments of the program's Lightning ``strategy``, or ``None``.

    Only where the package is put to work for the program (``LIGHTNING_ANYACCEL_ACTIVATE=1``), only
    on device types Lightning has no accelerator for, and only for instances of exactly one of
    Lightning's classes in :data:`~lightning_anyaccel.wiring.activation.PROGRAM_STRATEGIES` whose arguments were recorded
    (:func:`lightning_anyaccel._lightning.record_constructor_arguments`).
    """
    from lightning_anyaccel.strategies.base import AnyStrategyMixin

    if isinstance(strategy, AnyStrategyMixin) or not activation.is_active():
        return None
    name = activation.PROGRAM_STRATEGIES.get(type(strategy).__name__)
    arguments = _lightning.constructor_arguments(strategy)
    if name is None or arguments is None or get_spec(accelerator.device_type).lightning_builtin is not None:
        return None
    args, kwargs = arguments
    ours = _registered_class(strategy, name)
    rebuilt = ours(*args, **kwargs)
    _lightning_info(strategy, (
        f"lightning-anyaccel: the program's {type(strategy).__name__}(...) trains on {accelerator.device_type!r} as"
        f" the package's {type(rebuilt).__name__} with the same arguments ({activation.ACTIVATE_ENV}=1)."))
    return rebuilt


def _registered_class(strategy: Any, name: str) -> type:
    """The class registered as ``name`` with the front end (Trainer or Fabric, package) ``strategy`` was built for."""
    distribution = _lightning.distribution_of(strategy) or _lightning.LIGHTNING
    if type(strategy).__module__.startswith(distribution.fabric + "."):
        registry = distribution.module("lightning.fabric.strategies").STRATEGY_REGISTRY
    else:
        registry = distribution.module("lightning.pytorch.strategies").StrategyRegistry
    cls: type = registry[name]["strategy"]
    return cls


def _lightning_info(obj: Any, message: str) -> None:
    """Log ``message`` on rank zero through Lightning's logger of the package ``obj`` was built for."""
    distribution = _lightning.distribution_of(obj) or _lightning.LIGHTNING
    distribution.module("lightning.fabric.utilities.rank_zero").rank_zero_info(message)


def check(view: _lightning.ConnectorView) -> None:
    """Accept the package's strategies; refuse or repair Lightning's (see the module docstring).

    Raises:
        StrategyNotSupportedError: a Lightning strategy that would train elsewhere or run CUDA-only code.
    """
    from lightning_anyaccel.strategies.base import AnyStrategyMixin

    if getattr(view.accelerator, "found_by_auto", None) and auto.first_process():
        _lightning_info(view.connector, "lightning-anyaccel: " + auto.found_message(
            view.accelerator, view.strategy, view.num_devices, view.num_nodes))
    if isinstance(view.strategy, AnyStrategyMixin):
        return
    _refuse_foreign(view.strategy, view.accelerator)
    view.precision = align_precision_plugin(view.precision, view.accelerator.device_type)


def _refuse_foreign(strategy: Any, accelerator: Any) -> None:
    """Refuse a strategy that is not the package's where it would not train on the accelerator's device."""
    from lightning_anyaccel.strategies.base import AnyStrategyMixin

    if isinstance(strategy, AnyStrategyMixin):
        return
    device_type = accelerator.device_type
    spec = get_spec(device_type)
    name = type(strategy).__name__
    suggestion = next(
        (ours for cls in type(strategy).__mro__ if (ours := CLASS_EQUIVALENTS.get(cls.__name__))), "any_ddp"
    )
    if spec.lightning_builtin is None:
        program = (
            f" {activation.ACTIVATE_ENV}=1 rebuilds only instances of exactly Lightning's"
            f" {', '.join(activation.PROGRAM_STRATEGIES)} built after the package was imported, not a subclass."
            if activation.is_active() else ""
        )
        raise StrategyNotSupportedError(
            f"Lightning's {name} can not train on {spec.name} ({device_type!r}): it runs CUDA-only code paths or"
            f" trains on CPU. Pass strategy={suggestion!r} (the same strategy on the accelerator's device type)."
            + program
        )
    root = _lightning.single_device_root(strategy)
    if root is not None and root.type != device_type:
        raise StrategyNotSupportedError(
            f"{name} runs on {root}, but the accelerator is {accelerator!r}: the model would train on"
            f" {root.type}. Pass strategy={suggestion!r}, or no strategy."
        )


def check_arguments(distribution: _lightning.Distribution, arguments: tuple[Any, ...]) -> None:
    """Refuse objects of the package built for the other Lightning package.

    Raises:
        FrontEndMismatchError: naming the module to import the object from instead.
    """
    for argument in _flatten(arguments):
        if not type(argument).__module__.startswith("lightning_anyaccel"):
            continue
        built_for = _lightning.distribution_of(argument)
        if built_for is None or built_for == distribution:
            continue
        module = "lightning_anyaccel" if distribution is _lightning.LIGHTNING else "lightning_anyaccel.pytorch_lightning"
        fabric_module = "lightning_anyaccel.fabric" if distribution is _lightning.LIGHTNING else "lightning_anyaccel.lightning_fabric"
        raise FrontEndMismatchError(
            f"{type(argument).__name__} was built for `{built_for.package}`, but it was given to a Trainer or Fabric"
            f" of `{distribution.package}`; the two packages' classes do not mix. Import it from `{module}` (Trainer)"
            f" or `{fabric_module}` (Fabric), or use the registered names (accelerator='any', strategy='any_ddp')."
        )


def _flatten(arguments: Any) -> list[Any]:
    items: list[Any] = []
    for argument in arguments:
        if isinstance(argument, (list, tuple)):
            items.extend(_flatten(argument))
        else:
            items.append(argument)
    return items


def _device_name(device_type: str) -> str:
    """The spec's name for messages; never raises (a log line must not stop training)."""
    try:
        return get_spec(device_type).name
    except Exception:  # noqa: BLE001 - a device torch half-knows must not break a CPU run's report
        return f"{device_type.upper()} device"


def _lightning_builtin(device_type: str) -> str | None:
    """Lightning's own accelerator name for ``device_type``, if any; never raises."""
    try:
        return get_spec(device_type).lightning_builtin
    except Exception:  # noqa: BLE001 - see _device_name
        return None


def log_device_info(trainer: Any) -> None:
    """What Lightning's device report says, for the package's accelerator: the device it trains on.

    Lightning's report knows CUDA, MPS and TPU only. This one names the device type torch reports,
    and warns, naming the fix, when the Trainer trains elsewhere (on CPU while a GPU is there).
    It never raises: an unknown or broken device elsewhere in the process only changes the wording.

    Example (on a machine with one GPU)::

        NVIDIA GPU (CUDA) available: True (cuda), used: True (AnyAccelerator, 1 device(s))
    """
    distribution = _lightning.distribution_of(trainer) or _lightning.LIGHTNING
    rank_zero = distribution.module("lightning.pytorch.utilities.rank_zero")  # the user's logger names
    from lightning_anyaccel.device import runtime

    used = trainer.accelerator.device_type
    try:
        found = runtime.detect_device_type()
    except Exception:  # noqa: BLE001 - see the docstring
        found = used
    if is_host(found):
        rank_zero.rank_zero_info(f"No accelerator found: training on CPU (AnyAccelerator, {trainer.num_devices}"
                                 " process(es))")
        return
    name = _device_name(found)
    rank_zero.rank_zero_info(f"{name} available: True ({found}), used: {used == found}"
                             + (f" (AnyAccelerator, {trainer.num_devices} device(s))" if used == found else ""))
    if used != found:
        rank_zero.rank_zero_warn(
            f"{name} ({found}) is available but this Trainer trains on {used}: AnyAccelerator() or"
            f" accelerator='any' picks the {found}."
        )


def unused_device_message(device_type: str, used: str) -> str:
    """The line :func:`log_unused_devices` logs for a present ``device_type`` Lightning does not pick.

    >>> unused_device_message("acme", "cpu")
    "ACME device available: True (acme), used: False (Lightning's accelerator trains on cpu; accelerator='any' or 'acme' trains on it)"
    """
    return (f"{_device_name(device_type)} available: True ({device_type}), used: False (Lightning's accelerator"
            f" trains on {used}; accelerator='any' or {device_type!r} trains on it)")


def log_unused_devices(trainer: Any) -> None:
    """After Lightning's own report: name a present device only the package serves, and how to use it.

    ``accelerator="auto"`` never picks such a device (Lightning tries TPU, MPS, CUDA, then CPU), and
    Lightning's report says nothing about it. Never raises.
    """
    try:
        from lightning_anyaccel.device.devices import present_device_types

        used = getattr(getattr(trainer, "strategy", None), "root_device", None)
        used_type = getattr(used, "type", "cpu")
        unused = [t for t in present_device_types() if t != used_type and _lightning_builtin(t) is None]
        distribution = _lightning.distribution_of(trainer) or _lightning.LIGHTNING
        rank_zero = distribution.module("lightning.pytorch.utilities.rank_zero")
        for device_type in unused:
            rank_zero.rank_zero_info(unused_device_message(device_type, used_type))
    except Exception as err:  # noqa: BLE001 - a log line must never stop training
        log.debug("lightning-anyaccel: no report of unused devices: %s", err)


def fit_profiler(trainer: Any) -> None:
    """``profiler="pytorch"`` and ``PyTorchProfiler(...)`` on the package's accelerator: the device's own activity.

    Lightning's ``PyTorchProfiler`` records the host, and CUDA where CUDA is available. On a device
    Lightning has no accelerator of its own for (``xpu``, ``hpu``, ``npu``, ...), this adds the device's
    activity (:func:`~lightning_anyaccel.device.profiling.profiler_plan`) and sorts the report by the
    device's time, unless the user chose ``activities`` or ``sort_by_key``; where this torch can not
    record the device's activity it says so in one line and profiles the host. CPU, CUDA and MPS keep
    Lightning's profiler as it is, and so do other profilers and subclasses of ``PyTorchProfiler``.
    """
    from lightning_anyaccel.device.profiling import profiler_plan

    arguments = _lightning.constructor_arguments(getattr(trainer, "profiler", None))
    if arguments is None:  # no profiler asked for (PassThroughProfiler), another profiler, a subclass
        return
    profiler, device_type = trainer.profiler, trainer.accelerator.device_type
    if get_spec(device_type).lightning_builtin is not None:
        return
    given = arguments[1]
    plan = profiler_plan(device_type)
    if "activities" not in given:
        _lightning.profiler_kwargs(profiler)["activities"] = list(plan.activities)
        if plan.host_only_reason:
            distribution = _lightning.distribution_of(trainer) or _lightning.LIGHTNING
            distribution.module("lightning.pytorch.utilities.rank_zero").rank_zero_info(plan.host_only_reason)
    if "sort_by_key" not in given and len(arguments[0]) < 7:  # sort_by_key is the seventh positional argument
        _lightning.set_profiler_sort_key(profiler, plan.sort_key)


#: The policy as the connector hooks take it.
POLICY = _lightning.ConnectorPolicy(
    owns=owns, choose=choose, translate=translate, check=check, check_arguments=check_arguments,
    log_device_info=log_device_info, log_unused_devices=log_unused_devices, fit_profiler=fit_profiler,
    choose_accelerator=auto.choose_accelerator, rename_flags=vendor_names.rename,
)

__all__ = [
    "CLASS_EQUIVALENTS",
    "EQUIVALENTS",
    "POLICY",
    "FrontEndMismatchError",
    "StrategyNotSupportedError",
    "check",
    "check_arguments",
    "choose",
    "default_strategy",
    "fit_profiler",
    "owns",
    "translate",
]
