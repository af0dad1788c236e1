"""Ctrl-C and the worker processes dlcc spawns (`dlcc batch`'s pool, the fuzzers' pool).

Why: Ctrl-C sends SIGINT to the whole foreground process group, workers included. A worker that
takes it raises KeyboardInterrupt wherever it is: an idle one inside concurrent.futures, one
still importing dlcc in its interpreter's start-up. Each prints a traceback under the parent's
one-line "interrupted". The parent alone should handle Ctrl-C (it kills its workers).

How: spawn a worker with SIGINT blocked (`blocked_while_spawning`). The blocked mask survives
fork and exec, so the signal stays pending in the child from its first instruction until the
worker's own code ignores it and unblocks it (`ignore_in_worker`), which drops a pending one. In
the parent a blocked SIGINT is delayed, not lost: it arrives on unblocking. (Ignoring it in the
parent instead, whose disposition a child would also inherit, drops a Ctrl-C pressed during a
spawn.) multiprocessing's own resource tracker is started the same way.
"""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def blocked_while_spawning(spawning: bool = True):
    """Block SIGINT in this thread for the `with` body when `spawning` and this is the main thread
    (the one whose mask a spawned child inherits, and the one Python delivers signals to)."""
    if not spawning or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ignore_in_worker() -> None:
    """In a worker spawned under `blocked_while_spawning`: ignore SIGINT from now on, then unblock
    it (one that arrived during start-up was pending, and is dropped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
