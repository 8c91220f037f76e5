"""One code base for both Lightning packages: :class:`Distribution` names ``lightning`` and
``pytorch_lightning``; :func:`port` rebuilds a class of the package on the other package's bases.

Part of the contract (:mod:`lightning_anyaccel._lightning`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
from dataclasses import dataclass
from types import FunctionType
from typing import Any, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class Distribution:
    """One Lightning distribution, as users import it.

    Args:
        package: the top-level module users import (``"lightning"`` or ``"pytorch_lightning"``).
        trainer: the module root of its Trainer.
        fabric: the module root of its Fabric.
    """

    package: str
    trainer: str
    fabric: str

    def translate(self, module: str) -> str:
        """The name of ``module`` (a module of the ``lightning`` package) in this front end."""
        for root_of_lightning, own in ((LIGHTNING.trainer, self.trainer), (LIGHTNING.fabric, self.fabric)):
            if module == root_of_lightning or module.startswith(root_of_lightning + "."):
                return own + module[len(root_of_lightning):]
        return module

    def is_installed(self) -> bool:
        """Whether this distribution can be imported here (without importing it)."""
        return importlib.util.find_spec(self.package) is not None

    def module(self, name: str) -> Any:
        """Import a module of this front end, named as in ``lightning`` (``"lightning.fabric.connector"``)."""
        return importlib.import_module(self.translate(name))


#: ``import lightning`` (``lightning.pytorch`` and ``lightning.fabric``): the package's classes are written for it.
LIGHTNING = Distribution("lightning", "lightning.pytorch", "lightning.fabric")
#: ``import pytorch_lightning`` (with the stand-alone ``lightning_fabric``).
PYTORCH_LIGHTNING = Distribution("pytorch_lightning", "pytorch_lightning", "lightning_fabric")
DISTRIBUTIONS: tuple[Distribution, ...] = (LIGHTNING, PYTORCH_LIGHTNING)


def distribution_of_module(module: str) -> Distribution | None:
    """The front end a module belongs to, ``None`` for modules of neither."""
    for distribution in DISTRIBUTIONS:
        for root in (distribution.trainer, distribution.fabric):
            if module == root or module.startswith(root + "."):
                return distribution
    return None


def distribution_of(obj: Any) -> Distribution | None:
    """The front end whose Lightning classes ``obj`` (an instance or a class) is built on.

    >>> from lightning.pytorch import Trainer
    >>> distribution_of(Trainer) is LIGHTNING
    True
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        distribution = distribution_of_module(klass.__module__)
        if distribution is not None:
            return distribution
    return None


# ----- one code base for both packages ------------------------------------------------------------

_PORTED: dict[tuple[type, str], type] = {}

#: Where the ported classes of each front end can be imported from (and found again by pickle):
#: (front end package, the original lives under lightning_anyaccel.fabric) -> module.
_PORT_MODULES: dict[tuple[str, bool], str] = {
    ("pytorch_lightning", False): "lightning_anyaccel.pytorch_lightning",
    ("pytorch_lightning", True): "lightning_anyaccel.lightning_fabric",
}


def port(obj: T, distribution: Distribution) -> T:
    """``obj`` for ``distribution``: Lightning classes are looked up there, the package's classes rebuilt.

    A class of this package whose bases include a Lightning class is rebuilt once (then cached)
    on the ported bases, with every class attribute ported the same way. Methods share their code
    with the original; only their ``__class__`` cell (what zero-argument ``super()`` reads) points at
    the rebuilt class. The rebuilt class lives in :mod:`lightning_anyaccel.pytorch_lightning` (Trainer
    side) or :mod:`lightning_anyaccel.lightning_fabric` (Fabric side), under the same name, so
    pickle (``spawn``) finds it again. Everything else is returned unchanged.

    >>> from lightning_anyaccel.strategies import AnyDDPStrategy
    >>> ported = port(AnyDDPStrategy, PYTORCH_LIGHTNING)
    >>> ported.__module__, [c.__module__ for c in ported.__mro__ if c.__name__ == "DDPStrategy"]
    ('lightning_anyaccel.pytorch_lightning', ['pytorch_lightning.strategies.ddp'])
    """
    if distribution is LIGHTNING or not isinstance(obj, type):
        return obj
    if distribution_of_module(obj.__module__) is LIGHTNING:
        module = importlib.import_module(distribution.translate(obj.__module__))
        return cast(T, functools.reduce(getattr, obj.__qualname__.split("."), module))
    if not obj.__module__.startswith("lightning_anyaccel") or distribution_of(obj) is not LIGHTNING:
        return obj
    key = (obj, distribution.package)
    if key not in _PORTED:
        _PORTED[key] = _rebuild(obj, distribution)
    return _PORTED[key]  # type: ignore[return-value]


def ported_class(module: str, name: str) -> type:
    """The ported class that ``module`` (one of :data:`_PORT_MODULES`) exposes as ``name`` (for pickle).

    Raises:
        AttributeError: no class of that name was ported for that module yet.
    """
    for (original, package), ported in _PORTED.items():
        if ported.__module__ == module and ported.__qualname__ == name:
            return ported
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def _rebuild(cls: type, distribution: Distribution) -> type:
    class_cell = types.CellType()
    namespace = {
        name: _rebind(port(value, distribution), class_cell, f"{cls.__qualname__}.{name}")
        for name, value in vars(cls).items()
        if name not in ("__dict__", "__weakref__")
    }
    namespace["_distribution"] = distribution
    fabric_side = cls.__module__.startswith("lightning_anyaccel.fabric")
    namespace["__module__"] = _PORT_MODULES[(distribution.package, fabric_side)]
    bases = tuple(port(base, distribution) for base in cls.__bases__)
    rebuilt = type(cls)(cls.__name__, bases, namespace)
    class_cell.cell_contents = rebuilt
    return rebuilt


def _rebind(value: Any, class_cell: types.CellType, where: str) -> Any:
    """``value`` with the ``__class__`` cell of its functions replaced by ``class_cell``."""
    if isinstance(value, staticmethod):
        return staticmethod(_rebind(value.__func__, class_cell, where))
    if isinstance(value, classmethod):
        return classmethod(_rebind(value.__func__, class_cell, where))
    if isinstance(value, property):
        fget, fset, fdel = (_rebind(f, class_cell, where) for f in (value.fget, value.fset, value.fdel))
        return property(fget, fset, fdel, value.__doc__)
    if not isinstance(value, FunctionType) or "__class__" not in value.__code__.co_freevars:
        wrapped = getattr(value, "__wrapped__", None)
        while wrapped is not None:
            if isinstance(wrapped, FunctionType) and "__class__" in wrapped.__code__.co_freevars:
                raise TypeError(f"{where} wraps a function that uses super(): it can not be ported; unwrap it.")
            wrapped = getattr(wrapped, "__wrapped__", None)
        return value
    closure = tuple(
        class_cell if name == "__class__" else cell
        for name, cell in zip(value.__code__.co_freevars, value.__closure__ or ())
    )
    function = FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, closure)
    function.__kwdefaults__ = value.__kwdefaults__
    return functools.update_wrapper(function, value, updated=())


__all__ = ["DISTRIBUTIONS", "Distribution", "LIGHTNING", "PYTORCH_LIGHTNING", "distribution_of", "distribution_of_module", "port", "ported_class"]
