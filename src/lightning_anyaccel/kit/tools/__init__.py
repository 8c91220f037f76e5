"""What the commands ``python -m lightning_anyaccel.verify`` and ``.validate`` run with, shipped with the package.

A tiny model and data set (:mod:`.demo`), the validation record a run writes and its checks
(:mod:`.records`), and the helpers of local multi-process runs (:mod:`.local_runs`: a free port,
a child's environment, Lightning's logs kept quiet). They ship because the two commands use them
on the user's machine; the tests, notebooks, examples and benchmarks use the same ones. It may
import the foundation and :mod:`lightning_anyaccel.device`; nothing but the two commands (and
the project's tests and scripts) imports it.
"""
