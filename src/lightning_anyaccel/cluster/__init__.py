"""Running as several processes on one or many machines, robustly.

What launchers tell each process (:mod:`.launch_layout`) and the cluster environment of MPI-style
launchers built on it (:mod:`.environments`); the checks and deadlines of the rendezvous
(:mod:`.rendezvous`); the launching process and its workers watching each other
(:mod:`.supervision`); the stall watchdog that turns a hang into a report of every rank's stack
(:mod:`.watchdog`); the Python releases whose forked workers can deadlock (:mod:`.fork_deadlock`);
the network interface gloo binds to (:mod:`.gloo_interface`); stale locks
of torch's extension builds (:mod:`.build_locks`). It knows no device and no strategy: it may
import the foundation only (``troubleshooting`` and the contract package ``_lightning``).
"""
