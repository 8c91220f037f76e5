"""Runtime patches of Lightning: the hooks the package installs in its accelerator connectors (Trainer
and Fabric) and in the Trainer's device report: they ask :mod:`lightning_anyaccel.wiring.policy` which strategy the
package's accelerator gets, and let it report the device a Trainer uses.

Part of the contract (:mod:`lightning_anyaccel._lightning`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from lightning_anyaccel._lightning.names import _FABRIC_CONNECTOR, _TRAINER_CONNECTOR
from lightning_anyaccel._lightning.porting import Distribution

# ----- the accelerator connectors -----------------------------------------------------------------

#: The accelerator connectors of the Trainer and of Fabric (names as in ``lightning``).
TRAINER_CONNECTOR = _TRAINER_CONNECTOR
FABRIC_CONNECTOR = _FABRIC_CONNECTOR


@dataclass
class ConnectorView:
    """What the policy reads and changes on a Lightning connector (Trainer's or Fabric's)."""

    connector: Any

    @property
    def accelerator(self) -> Any:
        return getattr(self.connector, "accelerator", None)

    @property
    def strategy_flag(self) -> Any:
        return self.connector._strategy_flag

    @strategy_flag.setter
    def strategy_flag(self, value: Any) -> None:
        self.connector._strategy_flag = value

    @property
    def num_devices(self) -> int:
        return len(self.connector._parallel_devices or [])

    @property
    def num_nodes(self) -> int:
        return int(self.connector._num_nodes_flag)

    @property
    def strategy(self) -> Any:
        return self.connector.strategy

    @property
    def precision(self) -> Any:
        """The precision plugin the connector made (Trainer: ``precision_plugin``; Fabric: ``precision``)."""
        return getattr(self.connector, self._precision_attr)

    @precision.setter
    def precision(self, plugin: Any) -> None:
        setattr(self.connector, self._precision_attr, plugin)

    @property
    def _precision_attr(self) -> str:
        return "precision_plugin" if hasattr(self.connector, "precision_plugin") else "precision"


_HOOK_MARK = "__lightning_anyaccel_hooks__"


def replace_function(distribution: Distribution, where: tuple[str, str],
                     wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace Lightning's module function ``where`` (module as in ``lightning``, name) of ``distribution`` with
    ``wrap(original)``, once: a function it already replaced stays (idempotent)."""
    module = distribution.module(where[0])
    original = getattr(module, where[1])
    if getattr(original, _HOOK_MARK, False):
        return
    replacement = functools.wraps(original)(wrap(original))
    setattr(replacement, _HOOK_MARK, True)
    setattr(module, where[1], replacement)


@dataclass(frozen=True)
class ConnectorPolicy:
    """The package's decisions, as :func:`install_connector_hooks` asks for them."""

    #: Whether an accelerator is the package's (only then does the policy decide anything).
    owns: Callable[[Any], bool]
    #: ``strategy="auto"``: the strategy to use.
    choose: Callable[[ConnectorView], Any]
    #: May replace a Lightning strategy name by the package's equivalent.
    translate: Callable[[ConnectorView], None]
    #: Refuses or repairs the strategy before Lightning configures its launcher.
    check: Callable[[ConnectorView], None]
    #: Refuses arguments built for another front end (``(distribution, arguments)``), for every accelerator.
    check_arguments: Callable[[Distribution, tuple[Any, ...]], None]
    #: Reports the device a Trainer with the package's accelerator uses (instead of Lightning's report).
    log_device_info: Callable[[Any], None]
    #: After Lightning's report for its own accelerators: names a present device only the package serves.
    log_unused_devices: Callable[[Any], None] = lambda trainer: None
    #: Fits the profiler of a Trainer with the package's accelerator to its device.
    fit_profiler: Callable[[Any], None] = lambda trainer: None
    #: ``accelerator="auto"``: given Lightning's choice (``"cpu"``, ``"cuda"``, ...), what to train with.
    choose_accelerator: Callable[[Distribution, str], Any] = lambda distribution, lightning_choice: lightning_choice
    #: May rename the connector's flags (``strategy``, ``accelerator``) before Lightning checks them, given the
    #: strategy names registered with it: a vendor plugin's strategy name.
    rename_flags: Callable[[dict[str, Any], Collection[str]], None] = lambda flags, registered: None


def install_connector_hooks(distribution: Distribution, connector: str, policy: ConnectorPolicy) -> None:
    """Let ``policy`` choose and check strategies for the package's accelerator (idempotent).

    Lightning's connectors pick ``SingleDeviceStrategy("cpu")`` or ``"ddp"`` for any accelerator
    that is not CUDA/MPS and have no hook for a third-party accelerator to change that. For a
    connector whose accelerator ``policy.owns``, this wraps three connector methods, in the order
    Lightning calls them:

    - ``_choose_strategy`` (only for ``strategy="auto"``): ``policy.choose`` returns the strategy;
    - ``_check_strategy_and_fallback``: ``policy.translate`` may replace a Lightning strategy name
      by the package's equivalent (before Lightning's CUDA-only refusals run);
    - ``_lazy_init_strategy``: ``policy.check`` refuses or repairs the strategy before Lightning
      configures its launcher.

    Connectors of every other accelerator run Lightning's code unchanged. A fourth wrap,
    ``_check_config_and_set_final_flags``, passes the user's arguments to
    ``policy.check_arguments`` first, so objects of the package built for the other front end
    fail with a message instead of Lightning's "invalid accelerator name", and ``policy.rename_flags`` may
    rename a strategy name Lightning has not registered (a vendor plugin's). A fifth,
    ``_choose_auto_accelerator`` (a static method: ``accelerator="auto"``), hands Lightning's choice
    to ``policy.choose_accelerator``, which may return the package's accelerator instead.
    """
    module_name, _, class_name = connector.rpartition(".")
    connector_class = getattr(distribution.module(module_name), class_name)
    if connector_class.__dict__.get(_HOOK_MARK, False):
        return

    def choose(original: Callable[[], Any], view: ConnectorView) -> Any:
        return policy.choose(view)

    def translate(original: Callable[[], Any], view: ConnectorView) -> Any:
        policy.translate(view)
        return original()

    def check(original: Callable[[], Any], view: ConnectorView) -> Any:
        policy.check(view)
        return original()

    _wrap(connector_class, "_choose_strategy", policy.owns, choose)
    _wrap(connector_class, "_check_strategy_and_fallback", policy.owns, translate)
    _wrap(connector_class, "_lazy_init_strategy", policy.owns, check)

    original_flags = connector_class._check_config_and_set_final_flags

    @functools.wraps(original_flags)
    def check_flags(self: Any, *args: Any, **kwargs: Any) -> Any:
        policy.check_arguments(distribution, (*args, *kwargs.values()))
        policy.rename_flags(kwargs, self._registered_strategies)  # Lightning passes its flags by keyword
        return original_flags(self, *args, **kwargs)

    connector_class._check_config_and_set_final_flags = check_flags

    lightning_auto = connector_class.__dict__.get("_choose_auto_accelerator")
    if not isinstance(lightning_auto, staticmethod):
        raise TypeError(f"{connector_class.__qualname__}._choose_auto_accelerator is not a static method any more;"
                        " lightning_anyaccel can not hook it.")
    choose_lightning_auto = lightning_auto.__func__

    @functools.wraps(choose_lightning_auto)
    def choose_auto() -> Any:
        return policy.choose_accelerator(distribution, choose_lightning_auto())

    connector_class._choose_auto_accelerator = staticmethod(choose_auto)
    setattr(connector_class, _HOOK_MARK, True)


_DEVICE_INFO = ("lightning.pytorch.trainer.setup", "_log_device_info")


def install_device_info_hook(distribution: Distribution, policy: ConnectorPolicy) -> None:
    """Let ``policy.log_device_info`` report the device of a Trainer with the package's accelerator (idempotent).

    ``Trainer.__init__`` calls ``setup._log_device_info(trainer)``, which only knows CUDA, MPS and TPU:
    for ``AnyAccelerator`` on a GPU it logs "used: False" and warns "GPU available but not used",
    and for every other device type it says nothing. Trainers of every other accelerator keep
    Lightning's report.
    """
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def log_device_info(trainer: Any) -> None:
            if policy.owns(getattr(trainer, "accelerator", None)):
                policy.log_device_info(trainer)
            else:
                original(trainer)
                policy.log_unused_devices(trainer)

        return log_device_info

    replace_function(distribution, _DEVICE_INFO, wrap)


_INIT_PROFILER = ("lightning.pytorch.trainer.setup", "_init_profiler")


def install_profiler_hook(distribution: Distribution, policy: ConnectorPolicy) -> None:
    """Let ``policy.fit_profiler`` fit a Trainer's profiler to the device of the package's accelerator (idempotent).

    ``Trainer.__init__`` builds its profiler (``profiler="pytorch"`` or the user's ``PyTorchProfiler(...)``) in
    ``setup._init_profiler(trainer, profiler)``, after its accelerator. Lightning's ``PyTorchProfiler`` records the
    host, and CUDA where CUDA is available, whatever device the Trainer uses. The arguments each
    ``PyTorchProfiler`` is built with are kept (:func:`record_constructor_arguments`), so that what the user chose
    (``activities``, ``sort_by_key``) stays as chosen. Trainers of every other accelerator keep Lightning's profiler
    unchanged.
    """
    record_constructor_arguments(distribution.module("lightning.pytorch.profilers").PyTorchProfiler)
    module = distribution.module(_INIT_PROFILER[0])
    original = getattr(module, _INIT_PROFILER[1])
    if getattr(original, _HOOK_MARK, False):
        return

    @functools.wraps(original)
    def init_profiler(trainer: Any, profiler: Any) -> None:
        original(trainer, profiler)
        if policy.owns(getattr(trainer, "accelerator", None)):
            policy.fit_profiler(trainer)

    setattr(init_profiler, _HOOK_MARK, True)
    setattr(module, _INIT_PROFILER[1], init_profiler)


_ARGUMENTS = "__lightning_anyaccel_arguments__"


def record_constructor_arguments(cls: type, when: Callable[[], bool] = lambda: True) -> None:
    """Keep the arguments each instance of exactly ``cls`` is built with while ``when()`` holds (idempotent; see
    :func:`constructor_arguments`).

    For Lightning's strategy classes while the package is put to work for a program
    (``LIGHTNING_ANYACCEL_ACTIVATE=1``): the program's ``FSDPStrategy(...)`` is rebuilt as the
    package's strategy with the same arguments (:mod:`lightning_anyaccel.wiring.policy`). Instances of
    subclasses record nothing: their own arguments are not the ones their base class receives.
    """
    if cls.__dict__.get(_HOOK_MARK, False):
        return
    original = cls.__dict__.get("__init__") or cls.__init__  # type: ignore[misc]

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if type(self) is cls and when():
            self.__dict__[_ARGUMENTS] = (args, dict(kwargs))
        original(self, *args, **kwargs)

    setattr(cls, "__init__", __init__)
    setattr(cls, _HOOK_MARK, True)


def constructor_arguments(obj: Any) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``(args, kwargs)`` ``obj`` was built with, for instances of a class given to :func:`record_constructor_arguments`."""
    recorded: tuple[tuple[Any, ...], dict[str, Any]] | None = getattr(obj, "__dict__", {}).get(_ARGUMENTS)
    return recorded


def _wrap(
    cls: type,
    method: str,
    owns: Callable[[Any], bool],
    replacement: Callable[[Callable[[], Any], ConnectorView], Any],
) -> None:
    original = getattr(cls, method)
    if not inspect.isfunction(original):
        raise TypeError(f"{cls.__qualname__}.{method} is not a plain method any more; lightning_anyaccel can not hook it.")

    @functools.wraps(original)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not owns(getattr(self, "accelerator", None)):
            return original(self, *args, **kwargs)
        return replacement(lambda: original(self, *args, **kwargs), ConnectorView(self))

    setattr(cls, method, hooked)


__all__ = ["ConnectorPolicy", "ConnectorView", "FABRIC_CONNECTOR", "TRAINER_CONNECTOR", "constructor_arguments",
           "install_connector_hooks", "install_device_info_hook", "install_profiler_hook",
           "record_constructor_arguments"]
