"""How the package joins Lightning: the names it registers, the strategy and device it picks.

- :mod:`~lightning_anyaccel.wiring.registration`: the names (``"any"``, ``"any_ddp"``, ...) and classes
  registered with each front end of each Lightning package;
- :mod:`~lightning_anyaccel.wiring.policy`: the strategy for ``strategy="auto"`` and the vendor names;
- :mod:`~lightning_anyaccel.wiring.auto`: what ``accelerator="auto"`` takes;
- :mod:`~lightning_anyaccel.wiring.activation`: what changes in a program run with
  ``LIGHTNING_ANYACCEL_ACTIVATE=1``.
"""
