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

Blocking it in the spawning thread is not enough in the parent: the kernel hands a process's
signal to any thread that does not block it (one started before the spawn: rich's progress
refresher in `dlcc batch`), Python's C handler notes it there, and the main thread then raises KeyboardInterrupt at
its next bytecode, which can be inside multiprocessing's Popen between starting the child and
writing it its start-up data. The child then reads EOF and dies with a traceback of its own
(EOFError in spawn_main), and, not yet in the pool's list, is not killed either. So the spawn
also runs under a Python handler that only notes a SIGINT; the program's own handler is called
once the spawn is done.
"""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def blocked_while_spawning(spawning: bool = True):
    """For the `with` body, when `spawning` and this is the main thread (the one whose mask a
    spawned child inherits, and the one Python runs signal handlers in): block SIGINT here, and
    hold a Ctrl-C another thread took until the body is done, then hand it to the program's own
    handler (KeyboardInterrupt by default)."""
    if not spawning or threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(frame))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # (one pending: noted, or the handler's)
        signal.signal(signal.SIGINT, handler)
        if noted and callable(handler):  # (default_int_handler raises KeyboardInterrupt)
            handler(signal.SIGINT, noted[0])
        elif noted and handler == signal.SIG_DFL:  # the default action: the process ends
            signal.raise_signal(signal.SIGINT)


def ignore_in_worker() -> None:
    """In a worker spawned under `blocked_while_spawning`: ignore SIGINT from now on, then unblock
    it (one that arrived during start-up was pending, and is dropped)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
