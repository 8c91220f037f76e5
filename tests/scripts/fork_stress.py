"""Fork while other threads enter and leave Python: how many forked children hang in their start (CPython gh-112275).

``python fork_stress.py N native|python``: 2 threads churn (``native``: native threads made with
``pthread_create`` whose body is a Python callback, so each one creates and deletes a Python thread
state without holding the GIL, as a C++ library's threads calling back into Python do; ``python``:
``threading.Thread`` objects started and joined, as the package's and Lightning's threads are) while
the main thread forks N children that exit at once. A child not gone within 1 s hangs: it is
``SIGKILL``ed and counted. Prints one JSON line: the Python version, the mode, N, the hung count and
whether any child was left.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time

BOUND_S = 1.0
libc = ctypes.CDLL(None)
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


@CALLBACK
def native_body(_: object) -> None:
    return None


def churn(mode: str, stop: threading.Event) -> None:
    tid = ctypes.c_ulong()
    while not stop.is_set():
        if mode == "native":
            if libc.pthread_create(ctypes.byref(tid), None, native_body, None) == 0:
                libc.pthread_join(tid, None)
        else:
            thread = threading.Thread(target=lambda: None)
            thread.start()
            thread.join()


def main() -> None:
    count, mode = int(sys.argv[1]), sys.argv[2]
    stop = threading.Event()
    for _ in range(2):
        threading.Thread(target=churn, args=(mode, stop), daemon=True).start()
    hung = 0
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        end = time.monotonic() + BOUND_S
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > end:
                hung += 1
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.001)
    stop.set()
    left = bool(open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split())
    print(json.dumps({"python": sys.version.split()[0], "mode": mode, "forks": count, "hung": hung, "left": left}))


if __name__ == "__main__":
    main()
