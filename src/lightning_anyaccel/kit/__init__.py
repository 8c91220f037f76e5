"""The kit: what ships beside the plugin to check, emulate and teach it; the plugin never imports it.

- the commands' implementations: :mod:`~lightning_anyaccel.kit.verify`, :mod:`~lightning_anyaccel.kit.validate`
  and :mod:`~lightning_anyaccel.kit.emulate` (users run ``python -m lightning_anyaccel.verify``,
  ``.validate`` and ``.emulate``, the thin entries in the package root);
- :mod:`~lightning_anyaccel.kit.emulator`: the emulated accelerator;
- :mod:`~lightning_anyaccel.kit.tools`: the demo model, the validation records, bounded local runs, the
  parity runs;
- :mod:`~lightning_anyaccel.kit.tutorial`: what the notebooks import.

This module imports nothing: the emulator's start-up hook loads ``kit.emulator`` without the package.
"""
