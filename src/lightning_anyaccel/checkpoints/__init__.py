"""Checkpoints that survive the move between machines, a crash mid-write and a preemption.

Portable loading, the atomic checkpoint IO and clear load errors (:mod:`.checkpoint`), replacing
a checkpoint on disk atomically (:mod:`.atomic_commit`), the checkpoint and clean exit on
``SIGTERM`` (:mod:`.preemption`), and re-pointing optimizers at parameters a device move replaced
(:mod:`.optimizer_params`). It may import the foundation and :mod:`lightning_anyaccel.device`,
never the strategies (they use it).
"""
