"""Benchmarks for lightning-anyaccel: plugin overhead, strategies side by side, collectives, first step, device calls.

Run them all with ``make bench`` (or ``python -m benchmarks [--quick]`` from the repository root).
Results go to ``benchmarks/results/<device type>.json``; :mod:`benchmarks.report` turns that file
into plots and the device's documentation page (``docs/benchmarks.md`` for CPU).

Every benchmark picks its device through :func:`lightning_anyaccel.detect_device_type` and the
device table, so the same code runs on CPU, CUDA, XPU, ... without changes.
"""
